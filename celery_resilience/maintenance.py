"""Maintenance windows: a breaker forced open until a time, with a note, ending by itself.

The breaker's scripts know no deadline: ``forced_open`` lasts until a person closes or resets
it. A window is a small record beside them, hash ``{P:breakers}:windows``: breaker name ->
JSON ``{"until": epoch seconds or null, "note": ..., "by": ..., "at": ...}``. The admin writes
it when forcing open (and every other lever of the admin or the CLI drops it); the beat drain
task calls :func:`end_expired` each pass, which resets a breaker whose window ended. Removing the
record is the claim, and only the record that was read is removed (a compare-and-delete): of
two passes that find it ended, one resets (one transition), and a window set again meanwhile is
kept. A reset that fails puts the record back, so the next pass tries again. Times are Redis's
(``Runtime.now``); a window ends within one beat period of its ``until``.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass
from typing import Any

from .redact import get_logger
from .runtime import Runtime

logger = get_logger("celery_resilience.maintenance")
_memory: dict[int, dict[str, str]] = {}  # the memory:// backend: one process
_memory_lock = threading.Lock()


@dataclass(frozen=True)
class Window:
    """Why and until when a person forced a breaker open."""

    until: float | None  # epoch seconds; ``None``: until someone closes it
    note: str
    by: str
    at: float  # when it was set

    def ended(self, now: float) -> bool:
        return self.until is not None and self.until <= now


def windows_key(key_prefix: str) -> str:
    return f"{{{key_prefix}:breakers}}:windows"


def windows(runtime: Runtime, stored: dict[str, str] | None = None) -> dict[str, Window]:
    """Every breaker's window (one read, unless ``stored`` holds what was read)."""
    found: dict[str, Window] = {}
    for name, raw in (_all(runtime) if stored is None else stored).items():
        try:
            data = json.loads(raw)
            found[name] = Window(data.get("until"), str(data["note"]), str(data["by"]), data["at"])
        except (ValueError, KeyError, TypeError):  # written by hand: ignored, never an error
            logger.warning("Unreadable maintenance window of breaker %r: %r", name, raw)
    return found


def start(runtime: Runtime, name: str, until: float | None, note: str, by: str) -> Window:
    """Force breaker ``name`` open, and remember until when and why. The record first: a breaker
    forced open with no record of its end would stay open until a person came."""
    window = Window(until, note, by, runtime.now())
    _put(runtime, name, json.dumps(asdict(window)))
    runtime.breaker(name).force_open()
    return window


def forget(runtime: Runtime, name: str) -> bool:
    """Drop the window of ``name`` (a person closed or reset it); whether there was one."""
    if runtime.config.in_memory:
        with _memory_lock:
            return _memory.get(id(runtime), {}).pop(name, None) is not None
    return bool(runtime.redis.hdel(windows_key(runtime.config.key_prefix), name))


def end_expired(runtime: Runtime) -> list[str]:
    """Reset every breaker whose window ended and that is still forced open; their names."""
    now = runtime.now()
    ended = []
    raw = _all(runtime)
    for name, window in windows(runtime, raw).items():
        if not window.ended(now) or not _claim(runtime, name, raw[name]):
            continue  # running, set again meanwhile, or another pass claimed it first
        breaker = runtime.breaker(name)
        try:
            if breaker.state != "forced_open":
                continue  # someone changed it by hand meanwhile: theirs to keep
            breaker.reset()
        except Exception:
            _put_back(runtime, name, raw[name])  # the next pass tries again
            raise
        logger.warning(
            "Breaker %r: maintenance window set by %s ended, reset (note: %s)",
            name,
            window.by,
            window.note or "none",
        )
        ended.append(name)
    return ended


def _all(runtime: Runtime) -> dict[str, str]:
    if runtime.config.in_memory:
        with _memory_lock:
            return dict(_memory.get(id(runtime), {}))
    raw = runtime.redis.hgetall(windows_key(runtime.config.key_prefix))
    return {_text(k): _text(v) for k, v in raw.items()}


def _put(runtime: Runtime, name: str, value: str) -> None:
    if runtime.config.in_memory:
        with _memory_lock:
            _memory.setdefault(id(runtime), {})[name] = value
        return
    runtime.redis.hset(windows_key(runtime.config.key_prefix), name, value)


#: Removes field ARGV[1] of KEYS[1] only while it still holds ARGV[2]: 1 if removed.
_CLAIM = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
    return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
"""


def _claim(runtime: Runtime, name: str, raw: str) -> bool:
    """Remove the window of ``name`` if it is still ``raw`` (compare-and-delete)."""
    if runtime.config.in_memory:
        with _memory_lock:
            held = _memory.get(id(runtime), {})
            if held.get(name) != raw:
                return False
            del held[name]
            return True
    key = windows_key(runtime.config.key_prefix)
    return bool(runtime.redis.eval(_CLAIM, 1, key, name, raw))


def _put_back(runtime: Runtime, name: str, raw: str) -> None:
    """A claimed window whose reset failed: back, unless a new one was set meanwhile."""
    if runtime.config.in_memory:
        with _memory_lock:
            _memory.setdefault(id(runtime), {}).setdefault(name, raw)
        return
    runtime.redis.hsetnx(windows_key(runtime.config.key_prefix), name, raw)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
