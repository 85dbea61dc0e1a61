"""Settling a task's permit: the call's outcome reported to its breaker, whatever happens."""

from __future__ import annotations

from ..breaker.permit import Permit
from ..redact import get_logger

logger = get_logger("celery_resilience.task")


def settle(permit: Permit | None, outcome: str, retry_after: float | None = None) -> None:
    """Report the call's outcome (a failure with the wait it asked for, its Retry-After);
    bookkeeping trouble never changes the task's fate."""
    if permit is None:
        return
    try:
        if outcome == "success":
            permit.success()
        elif outcome == "failure":
            permit.failure(retry_after)
        else:
            permit.release()
    except Exception:
        logger.exception("Could not record the outcome of a %s call", permit.breaker.name)
