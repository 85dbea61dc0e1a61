"""Carrying out a delivery's fate (``fate.py``): publish a retry, park, keep, wait.

The one place where the package's own failures become the next fate: whatever carrying out a
fate raises, ``fate.fallback`` names the next (a retry the broker refuses parks, a park the
store refuses keeps the message, a kept copy the broker refuses requeues it), and this tries
that, until one holds. Each failure is logged here, once. The fate that held is returned: the
caller ends the delivery by it (``ResilientTask`` raises Celery's ``Retry``, ``Ignore`` or
``Reject``; the worker's hard time limit acks or requeues the message).
"""

from __future__ import annotations

from typing import Any

from . import kept, parking
from .backout.entry import ParkedTask
from .breaker_key import breaker_of
from .config import ResilienceConfig
from .fate import Delivery, Fate, GiveUp, Keep, Park, Retry, Skip, Wait, fallback
from .redact import get_logger

logger = get_logger("celery_resilience.task")


def carry_out(
    task: Any, request: Any, fate: Fate, delivery: Delivery, config: ResilienceConfig
) -> Fate:
    """Perform ``fate`` for ``task``'s delivery ``request``, or the next fate of the chain when
    it fails; returns the one that held."""
    while True:
        try:
            entry = _perform(task, request, fate, delivery)
        except Exception as trouble:
            _failed(task, request, fate, trouble)
            fate = fallback(fate, trouble, delivery, config)
            continue
        _held(task, request, fate, entry)
        return fate


def _perform(task: Any, request: Any, fate: Fate, delivery: Delivery) -> ParkedTask | None:
    """The I/O of ``fate``: what may fail (the parked entry, for a park)."""
    match fate:
        case Retry(countdown, retries, cause, headers, eager):
            logger.info(
                "Task %s[%s] retry %d/%s in %.2fs: %r",
                task.name,
                request.id,
                retries,
                task.max_retries,
                countdown,
                cause,
            )
            if not eager:  # Celery runs an eager retry at once, in apply(): nothing to publish
                # Published here, not through Task.retry: Celery turns a failed publish there
                # into Reject(requeue=False), and with acks_late the message would be gone.
                task._send_again(request, countdown, retries, headers)
        case Park(reason, cause, due_in):
            runtime = task.runtime
            options = task.signature_from_request(request).options
            entry = parking.new_entry(
                task.name,
                request,
                options,
                breaker_of(task, request),
                reason,
                cause,
                runtime.now(),
                due_in,
            )
            parking.store(runtime.backout_store, entry)
            return entry
        case Keep(delay, _, headers):
            task._send_again(request, delay, delivery.retries, headers)
        case Wait(delay, claimed):
            logger.info(
                "Task %s[%s]: %s; kept, again in %.1fs", task.name, request.id, claimed, delay
            )
            task._send_again(request, delay, delivery.retries)
        case GiveUp(reason, failed, trouble):
            kept.give_up(task, request, reason, failed, trouble)
        case Skip():
            logger.info("Task %s[%s] already succeeded: skipped", task.name, request.id)
    return None


def _failed(task: Any, request: Any, fate: Fate, trouble: Exception) -> None:
    """Log what failed, once per cause where an outage repeats it for every task."""
    match fate:
        case Retry():
            task.runtime.retry_trouble.failed(
                trouble,
                "Could not publish the retry of %s[%s]; parked until it was due",
                task.name,
                request.id,
            )
        case Park(reason):
            task.runtime.park_trouble.failed(
                trouble,
                "Could not park %s[%s] (%s); kept in the broker",
                task.name,
                request.id,
                reason,
            )
        case Keep():
            logger.error(
                "Could not keep %s[%s] in the broker either (%s: %s): requeued",
                task.name,
                request.id,
                type(trouble).__name__,
                trouble,
            )


def _held(task: Any, request: Any, fate: Fate, entry: ParkedTask | None) -> None:
    """What follows a fate that held: the end of a logged outage, counters, the park's news."""
    match fate:
        case Retry(eager=False):
            task.runtime.retry_trouble.ok()
            task.runtime.count_retry(breaker_of(task, request))
        case Park():
            task.runtime.park_trouble.ok()
            if entry is not None:
                task._announce_parked(entry, request)
