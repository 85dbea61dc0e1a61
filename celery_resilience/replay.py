"""Replaying a parked entry: the one preflight (what a worker would refuse it for), the publish
with its task id and options, and a replay on demand (a person asked).

The drain uses the preflight and the publish for every entry it releases; ``sending.py`` sends
them in batches.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from celery.app.task import Context

from .drain_lock import drain_lock
from .errors import ParkedTaskDead
from .events import replay_dispatcher
from .headers import replay_headers
from .parked.entry import ParkedTask
from .parked.store import UNREADABLE_META, breaker_key, dead_code, dead_reason
from .parked.trust import TAMPERED, UNDECRYPTABLE, UNSIGNED
from .redact import get_logger
from .runtime import Runtime

#: Dead reasons of entries that can't be replayed even by hand: their bytes can't be read, or
#: can't be trusted (a person can't tell a forged entry from a real one either).
UNREADABLE = ("undecodable", UNREADABLE_META, TAMPERED, UNSIGNED)
#: Seconds a replay on demand holds the drain lock at most.
REPLAY_LEASE = 60.0

logger = get_logger("celery_resilience.drain")


@dataclass(frozen=True)
class Refusal:
    """Why an entry can't be published: ``dead_reason`` for the store, ``message`` for people."""

    dead_reason: str
    message: str


def preflight(
    runtime: Runtime, entry: ParkedTask, now: float, by_hand: bool = False
) -> Refusal | None:
    """What a worker would refuse this entry for, checked before it is published (``None``: go).

    The one place these checks live: the drain marks a refused entry dead, a replay on demand
    reports why it refused. The drain never sends a dead entry; a person may (``by_hand``), once
    its cause is gone (the checks below run again), unless its bytes can't be read.
    """
    if entry.status == "dead" or entry.dead_reason:
        reason = entry.dead_reason or "undecodable"
        if not by_hand or dead_code(reason) in UNREADABLE:
            return Refusal(reason, entry.exc_message or f"entry {entry.id} is {reason}")
    if entry.encrypted:  # read without the key: its arguments are sealed, nothing to send
        return Refusal(UNDECRYPTABLE, f"entry {entry.id} is encrypted and no key here opens it")
    app = runtime.app
    # Publishing goes by name and needs no registration here: a task this process lacks (a
    # drain on a worker that serves other queues) is sent as it is. Only the arguments' check
    # needs the task's signature, so it runs where the task is known.
    if is_registered(app, entry.task_name):
        try:
            check_arguments(runtime, entry)
        except TypeError as exc:  # the args no longer fit the task's signature
            message = f"arguments don't fit {entry.task_name}: {exc}"
            return Refusal(dead_reason("bad_arguments", str(exc)), message)
    expires = expiry(entry, app)
    if expires is not None and expires <= now:
        when = datetime.fromtimestamp(expires, tz=timezone.utc).isoformat()
        return Refusal("expired", f"{entry.task_name}[{entry.task_id}] expired at {when}")
    return None


def expiry(entry: ParkedTask, app: Any) -> float | None:
    """When the task's ``expires`` passes (epoch seconds), or ``None`` if it never expires.

    A parked task keeps the ISO time its message carried; a naive one is in the app's time zone
    (as the worker reads it); a number is seconds after it was parked.
    """
    raw = entry.options.get("expires")
    if raw is None or raw == "":
        return None
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return entry.parked_at + float(raw)
    moment = raw
    if isinstance(raw, str):
        try:
            moment = datetime.fromisoformat(raw)
        except ValueError:
            return None  # unreadable: Celery will judge it when it arrives
    if not isinstance(moment, datetime):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=app.timezone)
    return moment.timestamp()


def publish(runtime: Runtime, entry: ParkedTask, producer: Any = None) -> None:
    """Send ``entry`` again with its task id and options (checked by :func:`preflight` first).

    Through ``send_task``, which takes the registered task's own options and routes as
    ``apply_async`` does, without checking the arguments a second time. Not added to the
    drain task's children: a drain of thousands would hold them all in its request. Sent once
    (``retry=False``): the drain decides what a failed publish means (the broker down: the batch
    is given back; the entry refused: it dies), where kombu's own retries would only hold the
    run for a second per entry of an outage.
    """
    options = replay_options(runtime, dict(entry.options))
    headers = replay_headers(options, entry.replays)
    options.pop("headers", None)
    app = runtime.app
    # send_task ignores eager mode: run it at once, as a test expects (if this process can).
    if app.conf.task_always_eager and entry.task_name in app.tasks:
        task = app.tasks[entry.task_name]
        task.apply_async(
            entry.args, entry.kwargs, task_id=entry.task_id, headers=headers, **options
        )
        return
    app.send_task(
        entry.task_name,
        entry.args,
        entry.kwargs,
        task_id=entry.task_id,
        headers=headers,
        producer=producer,
        add_to_parent=False,
        retry=False,
        **options,
    )


def replay_options(runtime: Runtime, options: dict[str, Any]) -> dict[str, Any]:
    """The publish options of a replay: its own, or routed to ``resilience_replay_queue``.

    The original exchange and routing key go with the override: they would win over the queue.
    """
    queue = runtime.config.replay_queue
    if queue is None:
        return options
    routed = {k: v for k, v in options.items() if k not in ("exchange", "routing_key")}
    routed["queue"] = queue
    return routed


def fail_task(runtime: Runtime, entry: ParkedTask, dead_reason: str) -> None:
    """Fail the task of an entry that just died, as a worker fails a task: its result becomes
    ``FAILURE`` (:class:`ParkedTaskDead`), its ``link_error`` callbacks are called, a chord it
    belongs to counts it (and so fails instead of waiting for it forever), a chain it heads is
    marked failed. Celery's own ``backend.mark_as_failure``, with the request its message had.

    Called once the entry is marked dead; trouble here is logged, never raised: the entry stays
    dead in the store either way, for a person to see.
    """
    if entry.status != "parked" or not entry.task_id:  # already dead, or never readable
        return
    app, options = runtime.app, entry.options
    task = app.tasks.get(entry.task_name)
    detail = f": last error {entry.exc_type}: {entry.exc_message}" if entry.exc_type else ""
    exc = ParkedTaskDead(
        f"{entry.task_name}[{entry.task_id}] is dead in the back-out store ({dead_reason}){detail}"
    )
    request = Context(
        id=entry.task_id,
        task=entry.task_name,
        args=entry.args,
        kwargs=entry.kwargs,
        root_id=options.get("root_id"),
        parent_id=options.get("parent_id"),
        group=options.get("group_id"),
        group_index=options.get("group_index"),
        chord=options.get("chord"),
        chain=options.get("chain"),
        callbacks=options.get("link"),
        errbacks=options.get("link_error"),
        delivery_info={},
    )
    ignore_result = options.get("ignore_result", task is not None and task.ignore_result)
    try:
        backend = app.backend if task is None else task.backend
        backend.mark_as_failure(
            entry.task_id,
            exc,
            traceback=entry.traceback or None,
            request=request,
            store_result=not ignore_result or bool(task and task.store_errors_even_if_ignored),
            call_errbacks=True,
        )
    except Exception:
        logger.exception("Could not fail %s[%s] in Celery", entry.task_name, entry.task_id)


_loaded: weakref.WeakSet[Any] = weakref.WeakSet()
_loading = threading.Lock()


def load_task_modules(app: Any) -> None:
    """Import the app's task modules once, as its workers do at start (again after a failure).

    A process that is not a worker (the CLI, a web process) has not run autodiscovery: a task
    found only that way would look absent there, and its arguments go unchecked.
    """
    with _loading:
        if app in _loaded:
            return
        try:
            app.loader.import_default_modules()
        except Exception:  # a broken task module: its tasks stay unknown, and that is reported
            logger.exception("Could not import the task modules of app %r", app.main)
            return
        _loaded.add(app)


def is_registered(app: Any, name: str) -> bool:
    """Whether ``app`` knows the task, after loading its task modules as a worker does."""
    if name not in app.tasks:
        load_task_modules(app)
    return name in app.tasks


def check_arguments(runtime: Runtime, entry: ParkedTask) -> None:
    """Celery's own check of args against the task's signature (``TypeError`` if they don't fit)."""
    task = runtime.app.tasks[entry.task_name]
    header = getattr(task, "__header__", None)
    if header is not None and getattr(task, "typing", True):
        header(*entry.args, **entry.kwargs)


def replay(runtime: Runtime, entry_id: str) -> ParkedTask:
    """Publish one entry now, whatever its breaker says (a person asked), then remove it.

    ``KeyError`` if absent; ``ValueError`` saying why if a worker would refuse it (an expired
    entry is marked dead on the way, as the drain would). A dead entry is sent if its cause is
    gone (its arguments fitting, not expired): its workflow, failed
    when it died, is not revived.
    """
    store = runtime.backout_store
    with drain_lock(runtime, REPLAY_LEASE, wait=10.0) as lock:
        if lock is None:
            raise TimeoutError("a drain holds the lock; try again in a moment")
        entry = store.get(entry_id)
        if entry is None:
            raise KeyError(entry_id)
        refusal = preflight(runtime, entry, runtime.now(), by_hand=True)
        if refusal is not None:
            if refusal.dead_reason == "expired" and store.mark_dead(entry_id, "expired"):
                fail_task(runtime, entry, refusal.dead_reason)
            elif dead_code(refusal.dead_reason) in (TAMPERED, UNSIGNED):
                store.mark_dead(entry_id, refusal.dead_reason)  # quarantined, as a drain does
            raise ValueError(refusal.message)
        publish(runtime, entry)
        with replay_dispatcher(runtime.app) as events:
            events.replayed(entry)
        store.delete(entry_id)
        store.bump({f"replayed|{breaker_key(entry.breaker)}": 1})
    logger.warning("Replayed %s[%s] (entry %s)", entry.task_name, entry.task_id, entry_id)
    return entry
