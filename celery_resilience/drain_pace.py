"""How much one drain run may release: the rate ceiling and the slow start after a breaker closes.

Both are kept between runs, fleet-wide (the next run may be on another worker), in one Redis hash
beside the drain lock, read and written under that lock (so no script is needed):

- ``tokens`` / ``at``: a token bucket at ``resilience_drain_rate`` per second holding at most
  ``resilience_drain_batch``: the rate is a ceiling over every run, whoever started it;
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

from .parked.redis_keys import BackoutKeys
from .runtime import Runtime

#: The state is refreshed at every run; a day without runs forgets it (a new ramp starts).
STATE_TTL = 86400
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

    def seconds_for(self, count: int) -> float:
        """Seconds until the bucket holds ``count`` tokens again (0 when it does)."""
        missing = min(count, self.config.drain_batch) - self.tokens
        return max(0.0, missing / self.config.drain_rate)

    def save(self) -> None:
        self._state["tokens"] = repr(self.tokens)
        self._state["at"] = repr(self.now)
        if self.config.in_memory:
            with _memory_lock:
                _memory[id(self.runtime)] = dict(self._state)
            return
        key = pace_key(self.config.key_prefix)
        with self.runtime.redis.pipeline(transaction=False) as pipe:
            pipe.hset(key, mapping=dict[Any, Any](self._state))
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


def _number(value: str | None, default: float) -> float:
    try:
        return default if value is None else float(value)
    except ValueError:
        return default
