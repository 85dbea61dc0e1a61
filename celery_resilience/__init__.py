"""celery-resilience: shared circuit breakers, jittered retries and a back-out store for Celery."""

from . import backoff, beat
from .breaker import Breaker, Permit
from .drain import DrainReport
from .errors import BreakerOpen, ConfigurationError, ResilienceError, StoreUnavailable
from .parked import ParkedTask
from .resilience import Resilience
from .task import ResilientTask

__version__ = "0.1.0"

__all__ = [
    "Breaker",
    "BreakerOpen",
    "ConfigurationError",
    "DrainReport",
    "ParkedTask",
    "Permit",
    "Resilience",
    "ResilienceError",
    "ResilientTask",
    "StoreUnavailable",
    "__version__",
    "backoff",
    "beat",
]
