"""Parking: turn a delivery that can't run now into a durable back-out entry.

This module builds the entry and stores it; carrying out the park (``carry_out.py``) announces
it (the ``PARKED`` state, the event and the signal) or, when the store says no, keeps the
message in the broker, and ``ResilientTask`` acks the message with ``Ignore`` only after the
store said yes. A crash between
the store's yes and the ack duplicates at worst, never loses: the entry id is derived from
(task id, replays, retries, a digest of the body), so a redelivered message parks onto the same
entry, and another message reusing the task id with other arguments parks beside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..backout.entry import ParkedTask, Reason
from ..backout.masking import Masking
from ..backout.store import EntryStore
from ..headers import (
    PARKED_SPAN_HEADER,
    REJECTED_HEADER,
    body_digest,
    entry_id,
    publish_options,
    replays_of,
    request_count,
)
from ..redact import get_logger
from . import turned_away
from .breaker_key import breaker_of
from .context import Delivery
from .kept import Cause, without_kept

logger = get_logger("celery_resilience.park")
#: The Celery state of a parked task (a custom state: Flower and the result backend show it).
PARKED = "PARKED"


def park(delivery: Delivery, reason: Reason, exc: Cause, due_in: float) -> ParkedTask:
    """``delivery`` as an entry, stored; the entry. Any error is the caller's to handle (keep
    the message in the broker)."""
    request, runtime = delivery.request, delivery.runtime
    breaker = breaker_of(delivery)

    def stored(span: str | None) -> ParkedTask:
        options = {**delivery.task.signature_from_request(request).options, **delivery.reprs()}
        now = runtime.now()
        entry = new_entry(
            delivery.task.name, request, options, breaker, reason, exc, now, due_in, span
        )
        store(runtime.backout_store, entry, delivery.masking)
        return entry

    tracing = runtime.tracing
    if tracing is None:
        return stored(None)
    return tracing.park(delivery.task.name, request.id, breaker, reason, stored)


def new_entry(
    task_name: str,
    request: Any,
    options: Mapping[str, Any],
    breaker: str | None,
    reason: Reason,
    exc: Cause,
    now: float,
    due_in: float = 0.0,
    span: str | None = None,
) -> ParkedTask:
    """The entry for this delivery (``request``), with what publishing it again needs;
    ``span``: the ``traceparent`` of the span that parks it, kept in its headers."""
    retries, replays = request.retries or 0, replays_of(request)
    args, kwargs = request.args or (), request.kwargs or {}
    kept = publish_options(options)
    if "headers" in kept:  # what told of this delivery only (a kept copy's marks, turn-aways):
        kept["headers"] = turned_away.forget(without_kept(kept["headers"]))  # a replay is new
    if reason == "breaker_open" and replays > 0:
        # A replay the breaker turned away unrun: it must not use up resilience_max_replays.
        kept["headers"] = {
            **kept.get("headers", {}),
            REJECTED_HEADER: request_count(request, REJECTED_HEADER) + 1,
        }
    if span is not None:  # signed and sealed with the rest of the options
        kept["headers"] = {**kept.get("headers", {}), PARKED_SPAN_HEADER: span}
    elif PARKED_SPAN_HEADER in kept.get("headers", {}):  # an earlier park's: not this one
        kept["headers"] = {k: v for k, v in kept["headers"].items() if k != PARKED_SPAN_HEADER}
    exc_type, exc_message = exc if isinstance(exc, tuple) else ("", "")
    return ParkedTask.new(
        task_name=task_name,
        task_id=request.id,
        reason=reason,
        args=args,
        kwargs=kwargs,
        options=kept,
        breaker=breaker,
        exc=None if isinstance(exc, tuple) else exc,
        exc_type=exc_type,
        exc_message=exc_message,
        retries=retries,
        replays=replays,
        parked_at=now,
        due_at=now + max(0.0, due_in),
    ).replace(id=entry_id(request.id, replays, retries, body_digest(args, kwargs, options)))


def store(store: EntryStore, entry: ParkedTask, masking: Masking) -> None:
    """Write ``entry`` to the back-out store; any error is the caller's to handle (keep the
    message in the broker): nothing here decides that a task may be lost. The log line shows
    of the error what ``resilience_error_text`` lets out (``masking``)."""
    store.park(entry)
    logger.warning(
        "Parked %s[%s] reason=%s breaker=%s entry=%s%s",
        entry.task_name,
        entry.task_id,
        entry.reason,
        entry.breaker,
        entry.id,
        f" error={error(entry, masking)}" if entry.exc_type else "",
    )


def error(entry: ParkedTask, masking: Masking) -> str:
    """``<type>: <message>`` of the entry's error, as ``resilience_error_text`` lets it out of
    the store (the type alone when no message may show)."""
    message = masking.error(entry.exc_message, entry.task_name, entry.args, entry.kwargs)
    return f"{entry.exc_type}: {message}" if message else entry.exc_type


def parked_meta(entry: ParkedTask, masking: Masking) -> dict[str, Any]:
    """The ``PARKED`` state's meta in the result backend."""
    return {
        "reason": entry.reason,
        "breaker": entry.breaker,
        "entry_id": entry.id,
        "due_at": entry.due_at,
        "exc_type": entry.exc_type,
        "exc_message": masking.error(entry.exc_message, entry.task_name, entry.args, entry.kwargs),
    }
