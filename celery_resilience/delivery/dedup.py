"""Deduplication: one delivery of a task id runs its body at a time; none after a success.

A task with ``deduplicate=True`` claims its task id in the admission's own round trip (the
breaker's script, or ``deliver.lua`` without a breaker), under a token of its delivery and a
lease. The success marker replaces the claim; any other ending gives it back at once; a worker
killed mid-body leaves it to its lease. A delivery that finds the id claimed waits in the broker
(published again, same id and retry count) until the claim could end, or for
``resilience_keep_delay`` if that is sooner, then asks again (``fate.py`` decides it, as it
decides for a delivery whose id already succeeded: acked, not run).

With a dedup key (``deduplicate="order:{order_id}"``, ``dedup_key.py``) the key is claimed and
marked instead of the task id, by the same rules: a delivery of another task id with the key
waits while one runs, and is skipped once one succeeded (for ``resilience_dedup_ttl``), its
state ``DUPLICATE``; a failure gives the key back, so the other task id runs then.
"""

from __future__ import annotations

import uuid
from typing import Any

from ..config import ResilienceConfig
from ..config.limits import hard_limit
from ..headers import delivery_token
from ..redact import get_logger
from .context import Delivery
from .dedup_key import key_of

logger = get_logger("celery_resilience.task")
#: The Celery state of a task id skipped because its dedup key succeeded as another task id.
DUPLICATE = "DUPLICATE"


def claim_of(delivery: Delivery, config: ResilienceConfig) -> dict[str, Any]:
    """The ``DeliveryQuestions`` fields of this delivery's claim: its token (the one the worker's
    main process gave the delivery, which gives the claim back if the pool child dies) and the
    lease in microseconds, from the hard time limit the worker applies to it. None without
    ``deduplicate``, nor for an eager call (Celery runs an eager retry inside the body that
    asked for it: a claim would refuse the task's own retry); an eager call still respects the
    claims of others."""
    request = delivery.request
    if not delivery.options.deduplicate or request.is_eager:
        return {}
    lease = config.claim_lease(hard_limit(delivery.task, request, delivery.runtime.worker))
    token = delivery_token(request) or uuid.uuid4().hex
    return {"claim": token, "lease_us": round(lease * 1_000_000)}


def give_back(delivery: Delivery, claim: str) -> None:
    """This delivery did not succeed: another delivery of the id may run it now."""
    if not claim:
        return
    task_id = delivery.request.id
    try:
        delivery.runtime.unclaim(delivery.options.breaker, task_id, claim, key_of(delivery))
    except Exception:  # the lease ends the claim anyway: bookkeeping never changes the outcome
        logger.exception("Could not give back the claim on task id %s", task_id)


def mark_done(delivery: Delivery) -> None:
    """The body succeeded: the success marker replaces the claim."""
    request = delivery.request
    try:
        delivery.runtime.mark_done(delivery.options.breaker, request.id, key_of(delivery))
    except Exception:  # the work is done: bookkeeping must not turn it into a failure
        logger.exception("Could not mark %s[%s] done", delivery.task.name, request.id)


def done_by(delivery: Delivery) -> str:
    """The task id the delivery's dedup key succeeded as, ``""`` when it is the delivery's own
    (or unknown, or no key): a delivery turned down as done is a duplicate of another task id
    only if this names one."""
    key = key_of(delivery)
    if not key:
        return ""
    try:
        holder = delivery.runtime.guard.done_by(delivery.options.breaker, key)
    except Exception:  # skipped all the same: only what it is called depends on this
        logger.exception("Could not read which task id succeeded as %s", key)
        return ""
    return "" if holder is None or holder == delivery.request.id else holder
