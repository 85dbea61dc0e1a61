"""celery-resilience: shared circuit breakers, jittered retries and a back-out store for Celery."""

from . import backoff, beat, worker
from .backout import ParkedTask
from .breaker import Breaker, Permit
from .drain import DrainReport
from .errors import (
    AccessDenied,
    BreakerOpen,
    BulkheadFull,
    ConfigurationError,
    DrainBusy,
    EntryNotFound,
    NotReplayable,
    ParkedTaskDead,
    RateLimited,
    ResilienceError,
    StoreFull,
    StoreUnavailable,
    TaskIdClaimed,
    Unparkable,
)
from .resilience import Resilience
from .task import ResilientTask

__version__ = "0.4.0.dev0"

# The package takes part in the worker's lifecycle (settings checked at start, fresh connections
# in pool children, deferred records flushed at shutdown): installed once, here, for every app.
worker.connect()

__all__ = [
    "AccessDenied",
    "Breaker",
    "BreakerOpen",
    "BulkheadFull",
    "ConfigurationError",
    "DrainBusy",
    "DrainReport",
    "EntryNotFound",
    "NotReplayable",
    "ParkedTask",
    "ParkedTaskDead",
    "Permit",
    "RateLimited",
    "Resilience",
    "ResilienceError",
    "ResilientTask",
    "StoreFull",
    "StoreUnavailable",
    "TaskIdClaimed",
    "Unparkable",
    "__version__",
    "backoff",
    "beat",
]
