"""Parking: turn a delivery that can't run now into a durable back-out entry.

The entry is stored before the message is acked (the task raises ``Ignore`` only after
``park`` returned), so a crash in between duplicates at worst and never loses. The entry id is
derived from (task id, replays, retries), so a redelivered message parks onto the same entry.
"""

from __future__ import annotations

import logging
import sys
import uuid
from typing import TYPE_CHECKING, Any

from .backout.entry import ParkedTask, Reason
from .backout.store import StoreFull
from .errors import StoreUnavailable
from .events import send_task_parked
from .signals import task_parked

if TYPE_CHECKING:
    from .task import ResilientTask

logger = logging.getLogger("celery_resilience.park")

#: Message header carrying how often a parked task was replayed.
REPLAYS_HEADER = "resilience_replays"
#: Header counting replays the breaker rejected before the body ran (a half-open breaker
#: whose probe slot another call took): they must not use up ``resilience_max_replays``.
REJECTED_HEADER = "resilience_rejected"
#: Execution options that are entry fields of their own, or meaningless in a new message.
_NOT_OPTIONS = frozenset(
    {"task_id", "retries", "reply_to", "origin", "delivery_tag", "redelivered", "is_eager"}
)
#: Countdown of the retry that keeps a message in the broker while the store refuses it.
STORE_TROUBLE_COUNTDOWN = 30.0
_ENTRY_NAMESPACE = uuid.UUID("5b1c6c1e-6a0f-4d55-9d0b-2f1f0c1e7a11")
PARKED = "PARKED"


def _header(request: Any, name: str) -> int:
    value = getattr(request, name, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(name, 0)
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return 0


def replays_of(request: Any) -> int:
    """How often this task was published again from the back-out store."""
    return _header(request, REPLAYS_HEADER)


def rejected_replays(headers: dict[str, Any] | None) -> int:
    """Replays that the breaker turned away unrun (they do not count against max_replays)."""
    try:
        return max(0, int((headers or {}).get(REJECTED_HEADER, 0)))
    except (TypeError, ValueError):
        return 0


def entry_id(task_id: str, replays: int, retries: int) -> str:
    return uuid.uuid5(_ENTRY_NAMESPACE, f"{task_id}/{replays}/{retries}").hex


def publish_options(task: ResilientTask, request: Any) -> dict[str, Any]:
    """What ``apply_async`` needs to publish this message again: queue, priority, links..."""
    options = dict(task.signature_from_request(request).options)
    headers = dict(options.get("headers") or {})
    headers.pop(REPLAYS_HEADER, None)
    options["headers"] = headers
    return {k: v for k, v in options.items() if k not in _NOT_OPTIONS and v not in (None, {}, [])}


def _options(task: ResilientTask, request: Any, reason: Reason, replays: int) -> dict[str, Any]:
    options = publish_options(task, request)
    if reason == "breaker_open" and replays > 0:
        headers = options.setdefault("headers", {})
        headers[REJECTED_HEADER] = _header(request, REJECTED_HEADER) + 1
    return options


def park(
    task: ResilientTask, reason: Reason, exc: BaseException | None, request: Any, due_in: float
) -> ParkedTask:
    """Store the delivery in the back-out store; on store trouble keep it in the broker."""
    resilience = task.resilience
    retries, replays = request.retries or 0, replays_of(request)
    now = resilience.now()
    entry = ParkedTask.new(
        task_name=task.name,
        task_id=request.id,
        reason=reason,
        args=request.args or (),
        kwargs=request.kwargs or {},
        options=_options(task, request, reason, replays),
        breaker=task.breaker,
        exc=exc,
        retries=retries,
        replays=replays,
        parked_at=now,
        due_at=now + max(0.0, due_in),
    ).replace(id=entry_id(request.id, replays, retries))
    try:
        resilience.backout_store.park(entry)
    except (StoreFull, StoreUnavailable) as trouble:
        # Never drop: the message goes back to the broker as a retry and comes back later.
        logger.error(
            "Could not park %s[%s] (%s): %s; kept in the broker, again in %.0fs",
            task.name,
            request.id,
            reason,
            trouble,
            STORE_TROUBLE_COUNTDOWN,
        )
        # ``max_retries=None`` would mean the task's own limit, already spent by a task parked
        # on its last retry: Celery would fail it at once. A worker keeps retrying for as long
        # as the store refuses; an eager call (no broker to wait in) fails loudly at the limit.
        limit = None if request.is_eager else sys.maxsize
        try:
            raise task.retry(
                exc=trouble, countdown=STORE_TROUBLE_COUNTDOWN, max_retries=limit
            ) from trouble
        finally:
            task.__dict__.pop("override_max_retries", None)  # set by retry() on the shared task
    logger.warning(
        "Parked %s[%s] reason=%s breaker=%s entry=%s%s",
        task.name,
        request.id,
        reason,
        task.breaker,
        entry.id,
        f" error={entry.exc_type}: {entry.exc_message}" if entry.exc_type else "",
    )
    if not request.is_eager and not task.ignore_result and task.backend is not None:
        try:
            task.update_state(task_id=request.id, state=PARKED, meta=_meta(entry))
        except Exception:  # the entry is safe; a result backend hiccup must not undo that
            logger.exception("Could not store state PARKED for %s", request.id)
    send_task_parked(task, entry)
    task_parked.send(sender=task, entry=entry, request=request)
    return entry


def _meta(entry: ParkedTask) -> dict[str, Any]:
    return {
        "reason": entry.reason,
        "breaker": entry.breaker,
        "entry_id": entry.id,
        "due_at": entry.due_at,
        "exc_type": entry.exc_type,
        "exc_message": entry.exc_message,
    }
