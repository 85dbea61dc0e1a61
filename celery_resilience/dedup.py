"""Deduplication: one delivery of a task id runs its body at a time; none after a success.

A task with ``deduplicate=True`` claims its task id in the admission's own round trip (the
breaker's script, or ``deliver.lua`` without a breaker), under a token of its delivery and a
lease. The success marker replaces the claim; any other ending gives it back at once; a worker
killed mid-body leaves it to its lease. A delivery that finds the id claimed waits in the broker
(published again, same id and retry count) until the claim could end, or for
``resilience_keep_delay`` if that is sooner, then asks again (``fate.py`` decides it, as it
decides for a delivery whose id already succeeded: acked, not run).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .config import ResilienceConfig
from .redact import get_logger
from .runtime import Runtime

logger = get_logger("celery_resilience.task")


def hard_time_limit(task: Any, request: Any) -> float | None:
    """The hard time limit the worker enforces on this delivery (seconds), if any: the message's,
    else the task's, else the app's ``task_time_limit``."""
    limits = getattr(request, "timelimit", None) or (None, None)
    limit = limits[0] or getattr(task, "time_limit", None) or task.app.conf.task_time_limit
    return float(limit) if limit else None


def claim_of(task: Any, request: Any, config: ResilienceConfig) -> dict[str, Any]:
    """The ``Delivery`` fields of this delivery's claim: a token unique to it and the lease in
    microseconds. None without ``deduplicate``, nor for an eager call (Celery runs an eager
    retry inside the body that asked for it: a claim would refuse the task's own retry); an
    eager call still respects the claims of others."""
    if not task.deduplicate or request.is_eager:
        return {}
    lease = config.claim_lease(hard_time_limit(task, request))
    return {"claim": uuid.uuid4().hex, "lease_us": round(lease * 1_000_000)}


def give_back(runtime: Runtime, scope: str | None, task_id: str, claim: str) -> None:
    """This delivery did not succeed: another delivery of the id may run it now."""
    if not claim:
        return
    try:
        runtime.unclaim(scope, task_id, claim)
    except Exception:  # the lease ends the claim anyway: bookkeeping never changes the outcome
        logger.exception("Could not give back the claim on task id %s", task_id)


@contextmanager
def given_back_unless_done(task: Any, request: Any, claim: str) -> Iterator[None]:
    """Around the body: whatever it raises (a failure, a retry, ``Ignore``...), the claim is
    given back before the outcome is handled, so that a retry or a replay of the delivery
    finds the task id free; a success keeps it until the marker replaces it."""
    try:
        yield
    except BaseException:
        give_back(task.runtime, task.breaker, request.id, claim)
        raise
