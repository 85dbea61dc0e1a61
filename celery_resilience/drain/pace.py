"""How much one drain run may release: the rate ceiling and the slow start after a breaker closes.

Both are kept between runs, fleet-wide (the next run may be on another worker), in one Redis hash
beside the drain lock, read and written under that lock (so no script is needed):

- ``tokens`` / ``at``: a token bucket at ``resilience_drain_rate`` per second holding at most
  ``resilience_drain_batch``: the rate is a ceiling over every run, whoever started it;
- ``full|<breaker>``: since when the passes have found the breaker's bulkhead full, and when
  one last saw it so;
- ``probes|<breaker>``: the trip (``opened_total``) whose half-open probes a pass sent, and
  when;
- ``held|<breaker>``: a breaker named at call time that a pass found open, and until when
  (its ``open_until``): the passes skip it meanwhile while its family still lists it as
  troubled (``gate.still_held``), so a thousand open hosts cost nothing per pass;
- ``trips|<breaker>`` / ``window|<breaker>``: the slow start. A dependency that just came back
  gets ``resilience_drain_slow_start`` replays from the first run after its breaker closed, twice
  as many from each run that used its whole window, up to ``resilience_drain_batch``. A new trip
  of the breaker (its ``opened_total`` moved) starts the ramp over.

With ``memory://`` the state lives in the process (one process holds everything there).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from ..backout.redis_keys import BackoutKeys
from ..runtime import Runtime

#: The state is refreshed at every run; a day without runs forgets it (a new ramp starts).
STATE_TTL = 86400
#: A bulkhead last seen full longer ago than this (seconds) is not known to have stayed full:
#: the passes look at a full bulkhead about every second.
STALE = 3.0
_memory: dict[int, dict[str, str]] = {}
_memory_lock = threading.Lock()


def pace_key(key_prefix: str) -> str:
    return f"{BackoutKeys.for_prefix(key_prefix).tag}:drain-pace"


class DrainPace:
    """The pace state of one run: read at its start, written back once at its end."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.config = runtime.config
        self.now = runtime.now()
        self._state = dict(self._load())
        self._dropped: set[str] = set()  # fields to delete from the hash at save
        at = _number(self._state.get("at"), self.now)
        tokens = _number(self._state.get("tokens"), float(self.config.drain_batch))
        elapsed = max(0.0, self.now - at)
        self.tokens = min(float(self.config.drain_batch), tokens + elapsed * self.config.drain_rate)

    def window(self, breaker: str, snapshot: Mapping[str, Any]) -> int:
        """How many replays the slow start allows ``breaker`` (closed) in this run."""
        trips = str(snapshot.get("opened_total", 0))
        start = min(self.config.drain_slow_start, self.config.drain_batch)
        if self._state.get(f"trips|{breaker}") != trips:  # closed since it last tripped
            self._state[f"trips|{breaker}"] = trips
            self._state[f"window|{breaker}"] = str(start)
            return start
        return int(_number(self._state.get(f"window|{breaker}"), start))

    def spend(self, breaker: str | None, released: int, window: int | None) -> None:
        """Record ``released`` replays; a ramp whose whole window went out doubles."""
        self.tokens = max(0.0, self.tokens - released)
        if breaker is not None and window is not None and released >= window:
            grown = min(window * 2, self.config.drain_batch)
            self._state[f"window|{breaker}"] = str(grown)

    def full_for(self, breaker: str, full: bool) -> float:
        """Seconds the bulkhead of ``breaker`` has been full, as the passes saw it: 0 when this
        one sees a free slot, is the first to see it full, or the last sighting is too old to
        say the bulkhead stayed full since (``STALE``)."""
        key = f"full|{breaker}"
        if not full:
            if self._state.pop(key, None) is not None:
                self._dropped.add(key)
            return 0.0
        since, last = _pair(self._state.get(key))
        if since is None or last is None or self.now - last > STALE:
            since = self.now
        self._state[key] = f"{since!r}|{self.now!r}"
        return max(0.0, self.now - since)

    def probes_out(self, breaker: str, snapshot: Mapping[str, Any], lease: float) -> bool:
        """Whether a pass already sent this half-open's probes (same trip, within ``lease``)."""
        trip, sent = _pair(self._state.get(f"probes|{breaker}"))
        same_trip = trip == _number(str(snapshot.get("opened_total", 0)), 0.0)
        return same_trip and sent is not None and self.now - sent < lease

    def probes_sent(self, breaker: str, snapshot: Mapping[str, Any]) -> None:
        trip = _number(str(snapshot.get("opened_total", 0)), 0.0)
        self._state[f"probes|{breaker}"] = f"{trip!r}|{self.now!r}"

    def held_until(self, breaker: str) -> float | None:
        return _maybe(self._state.get(f"held|{breaker}", ""))

    def hold(self, breaker: str, until: float | None) -> None:
        """Remember that ``breaker`` holds its entries back until ``until`` (``None``: it no
        longer does)."""
        key = f"held|{breaker}"
        if until is not None:
            self._state[key] = repr(until)
        elif self._state.pop(key, None) is not None:
            self._dropped.add(key)

    def forget_others(self, breakers: set[str]) -> None:
        """Drop what is kept for breakers named at call time that hold no parked entries any
        more: the state stays as small as the hosts with entries (thousands come and go). A
        declared breaker's ramp is kept (its backlog may be empty for a moment)."""
        family_of = self.config.family_of
        for key in list(self._state):
            _, _, breaker = key.partition("|")
            if breaker and breaker not in breakers and family_of(breaker) is not None:
                del self._state[key]
                self._dropped.add(key)

    def seconds_for(self, count: int) -> float:
        """Seconds until the bucket holds ``count`` tokens again (0 when it does)."""
        missing = min(count, self.config.drain_batch) - self.tokens
        return max(0.0, missing / self.config.drain_rate)

    def save(self) -> None:
        for key, value in list(self._state.items()):  # sightings too old to mean anything
            last = _pair(value)[1] if key.startswith(("full|", "probes|")) else None
            if last is not None and self.now - last > STATE_TTL / 24:
                del self._state[key]
                self._dropped.add(key)
        self._state["tokens"] = repr(self.tokens)
        self._state["at"] = repr(self.now)
        if self.config.in_memory:
            with _memory_lock:
                _memory[id(self.runtime)] = dict(self._state)
            return
        key = pace_key(self.config.key_prefix)
        with self.runtime.redis.pipeline(transaction=False) as pipe:
            pipe.hset(key, mapping=dict[Any, Any](self._state))
            if self._dropped:
                pipe.hdel(key, *self._dropped)
            pipe.expire(key, STATE_TTL)
            pipe.execute()

    def _load(self) -> Mapping[str, str]:
        if self.config.in_memory:
            with _memory_lock:
                return dict(_memory.get(id(self.runtime), {}))
        raw = self.runtime.redis.hgetall(pace_key(self.config.key_prefix))
        return {_text(k): _text(v) for k, v in raw.items()}


class TokenBucket:
    """``rate`` tokens per second, at most ``capacity`` saved up, in the process: a person's
    drain (``Drainer.run``), which may wait for them."""

    def __init__(self, rate: float, capacity: float) -> None:
        self.rate, self.capacity = rate, max(capacity, 1.0)
        self.tokens = self.capacity
        self._last = time.monotonic()

    def take(self, n: int) -> None:
        """Block until ``n`` tokens are there, then spend them."""
        while True:
            now = time.monotonic()
            self.tokens = min(self.capacity, self.tokens + (now - self._last) * self.rate)
            self._last = now
            if self.tokens >= n or self.tokens >= self.capacity:
                self.tokens -= n
                return
            time.sleep((min(n, self.capacity) - self.tokens) / self.rate)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _pair(value: str | None) -> tuple[float | None, float | None]:
    """``"a|b"`` as two numbers (``None`` for what is missing or unreadable)."""
    first, _, second = (value or "").partition("|")
    return _maybe(first), _maybe(second)


def _maybe(value: str) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


def _number(value: str | None, default: float) -> float:
    try:
        return default if value is None else float(value)
    except ValueError:
        return default
