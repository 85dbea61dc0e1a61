"""celery-resilience: shared circuit breakers, jittered retries and a back-out store for Celery."""

from . import backoff, beat, worker
from .breaker import Breaker, Permit
from .drain import DrainReport
from .errors import (
    BreakerOpen,
    BulkheadFull,
    ConfigurationError,
    ParkedTaskDead,
    ResilienceError,
    StoreUnavailable,
    TaskIdClaimed,
    Unparkable,
)
from .parked import ParkedTask
from .resilience import Resilience
from .task import ResilientTask

__version__ = "0.1.0"

# The package takes part in the worker's lifecycle (settings checked at start, fresh connections
# in pool children, deferred records flushed at shutdown): installed once, here, for every app.
worker.connect()

__all__ = [
    "Breaker",
    "BreakerOpen",
    "BulkheadFull",
    "ConfigurationError",
    "DrainReport",
    "ParkedTask",
    "ParkedTaskDead",
    "Permit",
    "Resilience",
    "ResilienceError",
    "ResilientTask",
    "StoreUnavailable",
    "TaskIdClaimed",
    "Unparkable",
    "__version__",
    "backoff",
    "beat",
]
