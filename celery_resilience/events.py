"""Events Flower sees: task-scoped ``task-parked`` / ``task-replayed``, and breaker events.

Celery's event state maps unknown ``task-*`` events to custom task states, so a parked task
shows as ``PARKED`` in Flower. Events are sent with the worker's own hostname (a prefork
child's default dispatcher would use another name, and Flower would not match it).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

from kombu.utils import encoding

if TYPE_CHECKING:
    from .backout.entry import ParkedTask
from .headers import TASK_EVENTS_HEADER, request_header
from .redact import get_logger

logger = get_logger("celery_resilience.events")
#: kombu's ``repr`` that never raises (what Celery's own ``task-retried`` uses); untyped there.
safe_repr = cast(Callable[[object], str], encoding.safe_repr)
#: Set on a delivery's request once its ``task-retried`` went out: one a delivery, though a
#: retry that could not be published ends as a kept copy, published after an event of its own.
_RETRIED = "_resilience_retried"
#: Replay events sent in one message at most (a drain flushes at the end of each batch anyway).
REPLAY_EVENT_BUFFER = 1000
#: Seconds to wait for a connection of the app's pool before replays go unannounced.
POOL_TIMEOUT = 5.0


def parked_summary(entry: ParkedTask) -> str:
    """One line for Flower's ``result`` column: Flower shows Celery's own task fields only."""
    return f"parked: reason={entry.reason} breaker={entry.breaker or '-'} entry={entry.id}"


def send_task_parked(task: Any, entry: ParkedTask, error: str) -> None:
    """``task-parked`` with reason, breaker, entry id and due time, for the current task;
    ``error`` is what of the entry's error may leave the store (``resilience_error_text``).

    Flower keeps every field of the event but its API and pages show only Celery's task fields
    (``exception``, ``result``...), so the reason, breaker and entry id also go in ``result``.
    """
    request = task.request
    if request.is_eager or not getattr(task, "send_events", True):
        return
    try:
        task.send_event(
            "task-parked",
            reason=entry.reason,
            breaker=entry.breaker,
            entry_id=entry.id,
            due_at=entry.due_at,
            exception=error,
            result=parked_summary(entry),
            retry=False,
        )
    except Exception:  # monitoring must never turn a safely parked task into a failure
        logger.warning("Could not send task-parked for %s", request.id, exc_info=True)


def send_task_retried(task: Any, exc: BaseException | None) -> None:
    """Celery's ``task-retried`` for the current delivery, with its fields, where the retry is
    published and before it is (``exc``: the cause as the result backend shows it).

    Only where the worker's main process sends task events for the delivery; it then sends none
    itself (``headers.TASK_EVENTS_HEADER``), so that the retry's own events always come after.
    Once a delivery. The traceback is ``exc``'s own, not what it was raised in (that would show
    the body's exception, unmasked).
    """
    request = task.request
    if request.is_eager or not request_header(request, TASK_EVENTS_HEADER):
        return
    if getattr(request, _RETRIED, False):
        return
    setattr(request, _RETRIED, True)
    try:
        task.send_event(
            "task-retried",
            exception=safe_repr(exc),
            traceback="".join(traceback.format_exception(exc, chain=False)) if exc else "",
            retry=False,
        )
    except Exception:  # monitoring must never stop a retry
        logger.warning("Could not send task-retried for %s", request.id, exc_info=True)


def _worker_hostname() -> str | None:
    """The worker's own hostname inside a task (a prefork child's default is another name)."""
    from celery import current_task

    return getattr(getattr(current_task, "request", None), "hostname", None)


class ReplayEvents:
    """Sends ``task-replayed`` for each replayed entry through one dispatcher."""

    def __init__(self, dispatcher: Any) -> None:
        self.dispatcher = dispatcher

    def replayed(self, entry: ParkedTask) -> None:
        if self.dispatcher is None:
            return
        try:
            self.dispatcher.send(
                "task-replayed",
                uuid=entry.task_id,
                name=entry.task_name,
                entry_id=entry.id,
                replays=entry.replays + 1,
                breaker=entry.breaker,
                reason=entry.reason,
            )
        except Exception:
            logger.warning("Could not send task-replayed for %s", entry.task_id, exc_info=True)

    def flush(self) -> None:
        """Send what is buffered now (a drain's batch ended)."""
        if self.dispatcher is None:
            return
        try:
            self.dispatcher.flush()
        except Exception:
            logger.warning("Could not send task-replayed events", exc_info=True)


@contextmanager
def replay_dispatcher(app: Any, hostname: str | None = None) -> Iterator[ReplayEvents]:
    """A dispatcher for a batch of replays; monitoring trouble never stops a drain.

    Inside a task (the beat-driven drain runs in a worker) it speaks with the worker's own
    hostname: Flower takes the sender of a task event for a worker.
    """
    hostname = hostname or _worker_hostname()
    connection = None
    try:
        # A connection of the app's pool: connected, its channel made, by an earlier drain of
        # this process (a new connection costs a handful of round trips before the first event).
        connection = app.pool.acquire(block=True, timeout=POOL_TIMEOUT)
        # Buffered: one ``task.multi`` message per batch instead of one per entry (Celery's
        # event receivers, Flower's included, unpack it). The final state does not depend on
        # the order: Celery's event state ranks SUCCESS above custom states like REPLAYED.
        dispatcher = app.events.Dispatcher(
            connection, hostname=hostname, buffer_group=["task"], buffer_limit=REPLAY_EVENT_BUFFER
        )
    except Exception:
        logger.warning("Events unavailable: replays are not announced", exc_info=True)
        if connection is not None:
            connection.release()
        yield ReplayEvents(None)
        return
    try:
        yield ReplayEvents(dispatcher)
    finally:
        try:
            dispatcher.flush()
        except Exception:
            logger.warning("Could not send task-replayed events", exc_info=True)
        finally:
            dispatcher.close()
            connection.release()


def breaker_event_type(transition: str) -> str:
    """``opened`` -> ``resilience-breaker-opened``, ``half_opened`` -> ``...-half-opened``."""
    return "resilience-breaker-" + transition.replace("_", "-")


def send_breaker_event(app: Any, breaker: str, transition: str, state: str) -> None:
    """A worker event for a transition this process made (exactly once per transition).

    Sent with the worker's own hostname when inside a task, so Flower counts it for the worker.
    """
    if app.conf.task_always_eager:
        return
    try:
        with app.events.default_dispatcher(hostname=_worker_hostname()) as dispatcher:
            dispatcher.send(
                breaker_event_type(transition), breaker=breaker, state=state, retry=False
            )
    except Exception:
        logger.warning("Could not send the %s event of %r", transition, breaker, exc_info=True)
