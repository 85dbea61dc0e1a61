"""What the drain and beat last did, for the operator's views (metrics, the admin's overview).

Read from what the drain keeps anyway, plus two small keys beside the drain lock, in the
breakers' Redis whatever the store (``memory://`` keeps them per process):

- the last pass: the drain pace's ``at`` (every pass saves it, ``pace.py``);
- the last good pass: a pass that ended without errors writes the time (:func:`mark_drained`);
- a drain running now: the drain lock is held (``lock.py``), and for how long still;
- beat alive: the ``celery_resilience.drain`` task writes when it last ran (:func:`mark_ran`);
  beat sends it every ``beat_schedule(every=...)`` seconds.

Every time is Redis's (``TIME``, inside the one-line scripts that write them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..backout.redis.keys import BackoutKeys
from ..redis_io import unavailable
from ..runtime import Runtime
from .pace_store import pace_key

#: The drain task's record outlives this many seconds of silence (then it reads "never").
RAN_TTL = 7 * 24 * 3600.0
#: Writes Redis's time into KEYS[1] (ARGV[1]: seconds it lives, 0 for ever): one round trip.
_MARK = """
local t = redis.call('TIME')
local now = string.format('%d.%06d', t[1], t[2])
if tonumber(ARGV[1]) > 0 then
    redis.call('SET', KEYS[1], now, 'EX', ARGV[1])
else
    redis.call('SET', KEYS[1], now)
end
"""
_local: dict[tuple[int, str], float] = {}


@dataclass(frozen=True)
class DrainStatus:
    now: float
    last_pass_at: float | None  # the last drain pass, by beat, the CLI or a person
    last_good_at: float | None  # the last pass that ended without errors
    lock_seconds_left: float | None  # a drain holds the lock for this long still; None: none
    task_ran_at: float | None  # the beat drain task's last run

    @property
    def running(self) -> bool:
        return self.lock_seconds_left is not None


def _tag(runtime: Runtime) -> str:
    return BackoutKeys.for_prefix(runtime.config.key_prefix).tag


def last_drain_key(key_prefix: str) -> str:
    return f"{BackoutKeys.for_prefix(key_prefix).tag}:drain-last"


def _mark(runtime: Runtime, key: str, ttl: float) -> None:
    if runtime.config.in_memory:
        _local[id(runtime), key] = runtime.now()
        return
    with unavailable("drain status"):
        runtime.redis.eval(_MARK, 1, key, int(ttl))


def mark_drained(runtime: Runtime) -> None:
    """A drain pass ended without errors now."""
    _mark(runtime, last_drain_key(runtime.config.key_prefix), 0)


def mark_ran(runtime: Runtime) -> None:
    """The beat drain task ran now."""
    _mark(runtime, f"{_tag(runtime)}:drain-task-ran", RAN_TTL)


def last_drained(runtime: Runtime) -> float | None:
    """Epoch seconds of the last good pass, ``None`` if no drain recorded one."""
    key = last_drain_key(runtime.config.key_prefix)
    if runtime.config.in_memory:
        return _local.get((id(runtime), key))
    with unavailable("drain status"):
        return _number(runtime.redis.get(key))


def task_last_ran(runtime: Runtime) -> float | None:
    """Epoch seconds of the beat drain task's last run, ``None`` if none ran in ``RAN_TTL``."""
    key = f"{_tag(runtime)}:drain-task-ran"
    if runtime.config.in_memory:
        return _local.get((id(runtime), key))
    with unavailable("drain status"):
        return _number(runtime.redis.get(key))


def read(runtime: Runtime) -> DrainStatus:
    """The drain's status now (one pipeline)."""
    if runtime.config.in_memory:
        return DrainStatus(
            runtime.now(),
            None,
            last_drained(runtime),
            None,
            _local.get((id(runtime), f"{_tag(runtime)}:drain-task-ran")),
        )
    tag = _tag(runtime)
    with unavailable("drain status"), runtime.redis.pipeline(transaction=False) as pipe:
        pipe.time()
        pipe.hget(pace_key(runtime.config.key_prefix), "at")
        pipe.get(last_drain_key(runtime.config.key_prefix))
        pipe.pttl(f"{tag}:drain-lock")
        pipe.get(f"{tag}:drain-task-ran")
        (seconds, micros), at, good, pttl, ran = pipe.execute()
    return DrainStatus(
        now=seconds + micros / 1e6,
        last_pass_at=_number(at),
        last_good_at=_number(good),
        lock_seconds_left=pttl / 1000 if isinstance(pttl, int) and pttl >= 0 else None,
        task_ran_at=_number(ran),
    )


def _number(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value.decode() if isinstance(value, bytes) else value)
    except ValueError:
        return None
