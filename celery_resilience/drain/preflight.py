"""What republishing an entry checks: what a worker would refuse it for, and what ends it in
the drain (replays run out, an entry that sits under another breaker).

The one place these checks live: the drain marks a refused entry dead, a replay on demand
reports why it refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ..backout.entry import ParkedTask
from ..backout.store import UNREADABLE_META, breaker_key, dead_code, dead_reason
from ..backout.trust import TAMPERED
from ..headers import rejected_replays
from ..known_tasks import is_registered
from ..redact import get_logger
from ..repair import unreadable_here
from ..runtime import Runtime

#: Dead reasons of entries that can't be replayed even by hand, whatever this process reads in
#: them: metadata written by another release or by hand. (A copy of an entry already published,
#: dead ``replayed``, may be: a person may know better, see ``replay.py``.)
NEVER_REPLAYED = (UNREADABLE_META,)
#: Dead reason of an entry whose signed lifetime ended while it was parked.
STALE = "stale"
#: Replays (counting those the breaker turned away) after which an entry is dead regardless.
REJECTED_REPLAYS_FACTOR = 10

logger = get_logger("celery_resilience.drain")


@dataclass(frozen=True)
class Refusal:
    """Why an entry can't be published: ``dead_reason`` for the store, ``message`` for people;
    ``held``: not by this process, but maybe by another (it stays parked, never dead)."""

    dead_reason: str
    message: str
    held: bool = False


def preflight(
    runtime: Runtime, entry: ParkedTask, now: float, by_hand: bool = False
) -> Refusal | None:
    """What a worker would refuse this entry for, checked before it is published (``None``: go).

    The drain never sends a dead entry; a person may (``by_hand``), once its cause is gone (the
    checks below run again), if this process reads and verifies its bytes (an entry another
    process found undecodable or untrusted may read here: the checks are this process's).
    Entries held here (``held``) are the caller's to leave parked, never to refuse.
    """
    unreadable = unreadable_here(entry)
    if entry.held and entry.status == "parked":
        return Refusal("held", unreadable or entry.held, held=True)
    if entry.status == "dead" or entry.dead_reason:
        reason = entry.dead_reason or "undecodable"
        if unreadable is not None:
            return Refusal(reason, unreadable)
        if not by_hand or dead_code(reason) in NEVER_REPLAYED:
            return Refusal(reason, f"entry {entry.id} is dead ({reason})")
    elif unreadable is not None:
        return Refusal(entry.dead_reason or "undecodable", unreadable)
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
    if not by_hand and entry.expires_at is not None and entry.expires_at <= now:
        when = datetime.fromtimestamp(entry.expires_at, tz=timezone.utc).isoformat()
        return Refusal(
            STALE,
            f"entry {entry.id}'s signed lifetime ended at {when}: a drain can no longer tell it "
            "from a copy of one it published (replay it by hand if it is still wanted)",
        )
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


def drain_refusal(runtime: Runtime, name: str, entry: ParkedTask, now: float) -> Refusal | None:
    """What the drain refuses an entry of breaker ``name`` for (``None``: publish it): the
    :func:`preflight`, then its replays run out, then a breaker it does not belong to."""
    refusal = preflight(runtime, entry, now)
    if refusal is not None:
        return refusal
    rejected = rejected_replays(entry.options.get("headers"))
    max_replays = runtime.config.max_replays
    # Replays the breaker turned away unrun are not attempts; a hard cap still ends a
    # task that is turned away forever.
    if entry.replays - rejected >= max_replays or (
        entry.replays >= max_replays * REJECTED_REPLAYS_FACTOR
    ):
        return Refusal(
            "max_replays",
            f"{entry.task_name}[{entry.task_id}] was replayed {entry.replays} times",
        )
    if breaker_key(entry.breaker) != name:
        # Its signed payload names another breaker: moved into this ready set beside it,
        # around the gate of its own breaker.
        return Refusal(TAMPERED, f"entry {entry.id} sits under breaker {name!r}")
    return None


def check_arguments(runtime: Runtime, entry: ParkedTask) -> None:
    """Celery's own check of args against the task's signature (``TypeError`` if they don't fit)."""
    task = runtime.app.tasks[entry.task_name]
    header = getattr(task, "__header__", None)
    if header is not None and getattr(task, "typing", True):
        header(*entry.args, **entry.kwargs)
