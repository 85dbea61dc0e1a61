"""Where the drain's pace (``pace.py``) is kept between passes: one Redis hash beside the drain
lock, read once at a pass's start and written once at its end, under the lock (so no script is
needed); with ``memory://``, in the process (one process holds everything there).

The hash's fields (kept as the previous release wrote them: both read and write it during a
rolling upgrade): ``tokens`` / ``at``; ``trips|<breaker>`` / ``window|<breaker>`` (the slow
start); ``full|<breaker>`` (``<since>|<last>``); ``probes|<breaker>`` (``<trip>|<at>``);
``held|<breaker>`` (until when).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from ..backout.redis.keys import BackoutKeys
from ..runtime import Runtime
from .pace import BreakerPace, PaceState

#: The state is refreshed at every pass; a day without one forgets it (a new ramp starts).
STATE_TTL = 86400
_memory: dict[int, dict[str, str]] = {}
_memory_lock = threading.Lock()


def pace_key(key_prefix: str) -> str:
    return f"{BackoutKeys.for_prefix(key_prefix).tag}:drain-pace"


class PaceStore:
    """Reads and writes the fleet's :class:`PaceState` for one app."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.config = runtime.config
        self._loaded: set[str] = set()  # fields read: those no longer written are deleted

    def load(self) -> PaceState | None:
        """The state the last pass left (``None``: none kept)."""
        if self.config.in_memory:
            with _memory_lock:
                fields = dict(_memory.get(id(self.runtime), {}))
        else:
            raw = self.runtime.redis.hgetall(pace_key(self.config.key_prefix))
            fields = {_text(k): _text(v) for k, v in raw.items()}
        self._loaded = set(fields)
        return decode(fields)

    def save(self, state: PaceState) -> None:
        fields = encode(state)
        if self.config.in_memory:
            with _memory_lock:
                _memory[id(self.runtime)] = fields
            return
        key = pace_key(self.config.key_prefix)
        dropped = self._loaded - set(fields)
        with self.runtime.redis.pipeline(transaction=False) as pipe:
            pipe.hset(key, mapping=dict[Any, Any](fields))
            if dropped:
                pipe.hdel(key, *sorted(dropped))
            pipe.expire(key, STATE_TTL)
            pipe.execute()
        self._loaded = set(fields)


def encode(state: PaceState) -> dict[str, str]:
    fields = {"tokens": repr(state.tokens), "at": repr(state.at)}
    for name, pace in state.breakers.items():
        if pace.trips is not None:
            fields[f"trips|{name}"] = pace.trips
        if pace.window is not None:
            fields[f"window|{name}"] = str(pace.window)
        if pace.full_since is not None and pace.full_last is not None:
            fields[f"full|{name}"] = f"{pace.full_since!r}|{pace.full_last!r}"
        if pace.probes_trip is not None and pace.probes_at is not None:
            fields[f"probes|{name}"] = f"{pace.probes_trip!r}|{pace.probes_at!r}"
        if pace.held_until is not None:
            fields[f"held|{name}"] = repr(pace.held_until)
    return fields


def decode(fields: Mapping[str, str]) -> PaceState | None:
    """The state in the hash's fields; unreadable fields count as absent."""
    tokens, at = _maybe(fields.get("tokens")), _maybe(fields.get("at"))
    breakers: dict[str, dict[str, Any]] = {}
    for key, value in fields.items():
        kind, _, name = key.partition("|")
        if not name:
            continue
        record = breakers.setdefault(name, {})
        if kind == "trips":
            record["trips"] = value
        elif kind == "window":
            window = _maybe(value)
            record["window"] = None if window is None else int(window)
        elif kind == "full":
            record["full_since"], record["full_last"] = _pair(value)
        elif kind == "probes":
            record["probes_trip"], record["probes_at"] = _pair(value)
        elif kind == "held":
            record["held_until"] = _maybe(value)
    if tokens is None or at is None:
        return None if not breakers else PaceState(0.0, 0.0, _records(breakers))
    return PaceState(tokens, at, _records(breakers))


def _records(breakers: dict[str, dict[str, Any]]) -> dict[str, BreakerPace]:
    records = {name: BreakerPace(**values) for name, values in breakers.items()}
    return {name: pace for name, pace in records.items() if not pace.empty}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _pair(value: str | None) -> tuple[float | None, float | None]:
    """``"a|b"`` as two numbers (``None`` for what is missing or unreadable)."""
    first, _, second = (value or "").partition("|")
    return _maybe(first), _maybe(second)


def _maybe(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None
