"""Carrying out a delivery's fate (``fate.py``): publish a retry, park, keep, wait.

The one place where the package's own failures become the next fate: whatever carrying out a
fate raises, ``fate.instead`` names the next (a retry the broker refuses parks, a park the
store refuses keeps the message, a kept copy the broker refuses requeues it), and this tries
that, until one is carried out. Each failure is logged here, once. The fate carried out is
returned: the caller ends the delivery by it (``ResilientTask`` raises Celery's ``Retry``,
``Ignore`` or ``Reject``; its ``Request`` acks or requeues the message after a hard time limit).

What only Celery can do (publish the delivery's message again, the task's state and events)
goes through the delivery's task port (``context.TaskPort``); the rest is the runtime's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..backout.entry import ParkedTask
from ..config import ResilienceConfig
from ..events import send_task_parked, send_task_retried
from ..headers import REDELIVERED_HEADER, new_message_headers
from ..redact import get_logger
from ..signals import task_parked
from . import kept, parking, turned_away
from .breaker_key import breaker_of
from .context import Delivery
from .dedup import DUPLICATE
from .fate import Facts, Fate, GiveUp, Keep, Park, Retry, Skip, Wait, instead

logger = get_logger("celery_resilience.task")


def carry_out(delivery: Delivery, fate: Fate, facts: Facts, config: ResilienceConfig) -> Fate:
    """Perform ``fate`` for ``delivery``, or the next fate of the chain when it fails; returns
    the one carried out."""
    while True:
        try:
            entry = _perform(delivery, fate, facts)
        except Exception as trouble:
            _failed(delivery, fate, trouble)
            fate = instead(fate, trouble, facts, config)
            continue
        _carried_out(delivery, fate, entry)
        return fate


def _perform(delivery: Delivery, fate: Fate, facts: Facts) -> ParkedTask | None:
    """The I/O of ``fate``: what may fail (the parked entry, for a park)."""
    name, task_id = delivery.task.name, delivery.request.id
    match fate:
        case Retry(countdown, retries, cause, headers, eager):
            logger.info(
                "Task %s[%s] retry %d/%s in %.2fs: %r",
                name,
                task_id,
                retries,
                delivery.options.max_retries,
                countdown,
                delivery.shown(cause),
            )
            if not eager:  # Celery runs an eager retry at once, in apply(): nothing to publish
                send_task_retried(delivery.task, delivery.shown(cause))
                # Published here, not through Task.retry: Celery turns a failed publish there
                # into Reject(requeue=False), and with acks_late the message would be gone.
                _send_again(delivery, countdown, retries, headers)
        case Park(reason, cause, due_in):
            return parking.park(delivery, reason, cause, due_in)
        case Keep(delay, trouble, headers):
            send_task_retried(delivery.task, delivery.shown(trouble))
            _send_again(delivery, delay, facts.retries, headers)
        case Wait(delay, claimed):
            logger.info("Task %s[%s]: %s; kept, again in %.1fs", name, task_id, claimed, delay)
            _send_again(delivery, delay, facts.retries)
        case GiveUp(reason, failed, trouble):
            kept.give_up(delivery, reason, failed, trouble)
        case Skip(of, key) if of:
            logger.info(
                "Task %s[%s] is a duplicate: %s succeeded as %s; skipped", name, task_id, key, of
            )
            _mark_duplicate(delivery, of, key)
        case Skip():
            logger.info("Task %s[%s] already succeeded: skipped", name, task_id)
    return None


def _mark_duplicate(delivery: Delivery, of: str, key: str) -> None:
    """The result of a task id skipped because its dedup key succeeded as task id ``of``: state
    ``DUPLICATE``, naming both, so that it ends in a known state rather than ``PENDING``."""
    task, request = delivery.task, delivery.request
    if request.is_eager or task.ignore_result or task.backend is None:
        return  # an eager call's result is Celery's (IGNORED)
    try:
        task.update_state(task_id=request.id, state=DUPLICATE, meta={"key": key, "task_id": of})
    except Exception:  # skipped all the same: the state only tells why
        logger.exception("Could not store state DUPLICATE for %s", request.id)


def _send_again(
    delivery: Delivery, countdown: float, retries: int, extra: Mapping[str, Any] | None = None
) -> None:
    """Publish the delivery's message again, same task id, in ``countdown`` s (``extra``:
    headers): a new message, so none of what described this delivery (its redelivery flag, a
    kept copy's marks, the count of turn-aways in a row)."""
    signature = delivery.task.signature_from_request(
        delivery.request, countdown=countdown, retries=retries
    )
    options = signature.options
    options.pop(REDELIVERED_HEADER, None)  # from delivery_info
    fresh = turned_away.forget(kept.without_kept(new_message_headers(options.get("headers"))))
    options["headers"] = {**fresh, **(extra or {})}
    options.update(delivery.reprs())
    signature.apply_async()


def _failed(delivery: Delivery, fate: Fate, trouble: Exception) -> None:
    """Log what failed, once per cause where an outage repeats it for every task."""
    name, task_id, runtime = delivery.task.name, delivery.request.id, delivery.runtime
    match fate:
        case Retry():
            runtime.retry_trouble.failed(
                trouble,
                "Could not publish the retry of %s[%s]; parked until it was due",
                name,
                task_id,
            )
        case Park(reason):
            runtime.park_trouble.failed(
                trouble, "Could not park %s[%s] (%s); kept in the broker", name, task_id, reason
            )
        case Keep():
            logger.error(
                "Could not keep %s[%s] in the broker either (%s: %s): requeued",
                name,
                task_id,
                type(trouble).__name__,
                trouble,
            )


def _carried_out(delivery: Delivery, fate: Fate, entry: ParkedTask | None) -> None:
    """What follows a fate carried out: the end of a logged outage, counters, the park's news."""
    runtime = delivery.runtime
    match fate:
        case Retry(eager=False):
            runtime.retry_trouble.ok()
            runtime.count_retry(breaker_of(delivery))
        case Park():
            runtime.park_trouble.ok()
            if entry is not None:
                _announce_parked(delivery, entry)


def _announce_parked(delivery: Delivery, entry: ParkedTask) -> None:
    """The Celery side of a park: ``PARKED`` state, ``task-parked`` event, ``task_parked``."""
    task, request, masking = delivery.task, delivery.request, delivery.masking
    if not request.is_eager and not task.ignore_result and task.backend is not None:
        try:
            meta = parking.parked_meta(entry, masking)
            task.update_state(task_id=request.id, state=parking.PARKED, meta=meta)
        except Exception:  # the entry is safe; a result backend hiccup must not undo that
            logger.exception("Could not store state PARKED for %s", request.id)
    send_task_parked(task, entry, parking.error(entry, masking) if entry.exc_type else "")
    task_parked.send(sender=task, entry=entry, request=request)
