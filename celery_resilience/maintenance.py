"""Maintenance windows: a breaker forced open until a time, with a note, ending by itself.

A window has two halves. Its *hold* lives in the breaker's own state (``model.force``): the
``open`` order that starts it records the window's id and end there, every other order (a
person's lever from the CLI or the admin, ``Breaker.force_open``...) drops it in the same script
that changes the state, and ``end_window`` resets the breaker only while that very window still
holds it and has ended (Redis's time), in one step. Its *record*, hash ``{P:breakers}:windows``:
breaker name -> JSON ``{"id", "until": epoch seconds or null, "note", "by", "at"}``, is what
the admin shows and what the beat drain task's :func:`end_expired` looks for, each pass, to end
windows on time (within one beat period of their ``until``).

So whatever a person does as a window ends, the window's end can't undo it: either the end came
first (and the person's order followed), or the order dropped the hold and the end changes
nothing. Records come and go around the holds without locks: :func:`start` writes the record
before and after the order (a pass that drops it in between sees it back); :func:`pull` and a
pass drop only the record they read, never a new window set meanwhile (a compare-and-delete).
A record without an id was written by the previous release, whose orders know no hold (they
change the state and leave whatever hold was there): its window is ended as that release did,
by a reset while the breaker is forced open, unless a window set after that record (the hold
knows when it was set, the record when it was written, both in Redis's time) holds it. That
release's admin sets a window with a record, then an ``open`` that changes nothing on a breaker
already forced open: when an end resets the breaker meanwhile, the record it finds after the
reset says so, and the breaker is forced open again for that window.
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Literal

from .redact import get_logger
from .runtime import Runtime

logger = get_logger("celery_resilience.maintenance")
_memory: dict[int, dict[str, str]] = {}  # the memory:// backend: one process
_memory_lock = threading.Lock()
#: A person's levers, as the CLI and the admin name them.
LeverAction = Literal["open", "close", "reset"]


@dataclass(frozen=True)
class Window:
    """Why and until when a person forced a breaker open."""

    until: float | None  # epoch seconds; ``None``: until someone closes it
    note: str
    by: str
    at: float  # when it was set
    id: str = ""  # what holds the breaker (``""``: a record of a release before holds)

    def ended(self, now: float) -> bool:
        return self.until is not None and self.until <= now


def windows_key(key_prefix: str) -> str:
    return f"{{{key_prefix}:breakers}}:windows"


def windows(runtime: Runtime, stored: dict[str, str] | None = None) -> dict[str, Window]:
    """Every breaker's window record (one read, unless ``stored`` holds what was read)."""
    found: dict[str, Window] = {}
    for name, raw in (_all(runtime) if stored is None else stored).items():
        try:
            data = json.loads(raw)
            found[name] = Window(
                data.get("until"),
                str(data["note"]),
                str(data["by"]),
                data["at"],
                str(data.get("id") or ""),
            )
        except (ValueError, KeyError, TypeError):  # written by hand: ignored, never an error
            logger.warning("Unreadable maintenance window of breaker %r: %r", name, raw)
    return found


def start(runtime: Runtime, name: str, until: float | None, note: str, by: str) -> Window:
    """Force breaker ``name`` open for a new window, and record until when and why."""
    window = Window(until, note, by, runtime.now(), uuid.uuid4().hex)
    raw = json.dumps(asdict(window))
    _put(runtime, name, raw)  # first: a breaker held open with no record would never end
    runtime.breaker(name).open_for_window(window.id, until)
    _put(runtime, name, raw)  # again: a pass that found it before the hold dropped it
    return window


def pull(runtime: Runtime, name: str, lever: LeverAction) -> None:
    """A person's lever: force ``name`` open or closed, or reset it. It drops the window that
    held the breaker in the same step, then that window's record (not one set since)."""
    read = _one(runtime, name)
    breaker = runtime.breaker(name)
    {"open": breaker.force_open, "close": breaker.force_closed, "reset": breaker.reset}[lever]()
    if read is not None:
        _drop(runtime, name, read)


def end_expired(runtime: Runtime) -> list[str]:
    """End every window whose time is up: its breaker reset if that window still holds it, its
    record dropped; the names of the breakers reset."""
    now = runtime.now()
    ended = []
    raw = _all(runtime)
    for name, window in windows(runtime, raw).items():
        if not window.ended(now):
            continue
        # A failure raises before the record is dropped: the next pass tries again.
        if runtime.breaker(name).end_window(window.id, window.at):
            logger.warning(
                "Breaker %r: maintenance window set by %s ended, reset (note: %s)",
                name,
                window.by,
                window.note or "none",
            )
            ended.append(name)
            _reopen_for_previous(runtime, name, raw[name])
        _drop(runtime, name, raw[name])  # an order since dropped its hold: the person's now
    return ended


def _reopen_for_previous(runtime: Runtime, name: str, read: str) -> None:
    """The previous release's admin may have set a window as the one read ended: its record,
    then an ``open`` order that changes nothing on a breaker already forced open and leaves no
    hold, so the reset just made undid it. Its record tells: forced open again for it (its own
    end resets the breaker, as a record without an id does)."""
    now_raw = _one(runtime, name)
    if now_raw is None or now_raw == read:
        return
    window = windows(runtime, {name: now_raw}).get(name)
    if window is None or window.id or window.ended(runtime.now()):
        return
    runtime.breaker(name).force_open()
    logger.warning(
        "Breaker %r: forced open again for the maintenance window %s set as another ended",
        name,
        window.by,
    )


def _all(runtime: Runtime) -> dict[str, str]:
    if runtime.config.in_memory:
        with _memory_lock:
            return dict(_memory.get(id(runtime), {}))
    raw = runtime.redis.hgetall(windows_key(runtime.config.key_prefix))
    return {_text(k): _text(v) for k, v in raw.items()}


def _one(runtime: Runtime, name: str) -> str | None:
    if runtime.config.in_memory:
        with _memory_lock:
            return _memory.get(id(runtime), {}).get(name)
    raw = runtime.redis.hget(windows_key(runtime.config.key_prefix), name)
    return None if raw is None else _text(raw)


def _put(runtime: Runtime, name: str, value: str) -> None:
    if runtime.config.in_memory:
        with _memory_lock:
            _memory.setdefault(id(runtime), {})[name] = value
        return
    runtime.redis.hset(windows_key(runtime.config.key_prefix), name, value)


#: Removes field ARGV[1] of KEYS[1] only while it still holds ARGV[2]: 1 if removed.
_DROP = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
    return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
"""


def _drop(runtime: Runtime, name: str, raw: str) -> bool:
    """Remove the record of ``name`` if it is still ``raw`` (compare-and-delete)."""
    if runtime.config.in_memory:
        with _memory_lock:
            held = _memory.get(id(runtime), {})
            if held.get(name) != raw:
                return False
            del held[name]
            return True
    key = windows_key(runtime.config.key_prefix)
    return bool(runtime.redis.eval(_DROP, 1, key, name, raw))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
