"""In-process breaker store: the model behind a lock, for tests and single-process apps.

The lock is held only for the decision itself, never around the protected call.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

from . import model
from .model import Action, BreakerState, Change, Decision, Kind, Limits, Skip
from .store import Delivery


def _wall_clock_us() -> int:
    return time.time_ns() // 1000


class MemoryBreakerStore:
    """Every breaker of one process; ``clock`` returns microseconds."""

    def __init__(self, clock: Callable[[], int] = _wall_clock_us) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._states: dict[str, BreakerState] = {}
        self._deliveries: dict[tuple[str | None, str, int, int], int] = {}
        self._done: dict[tuple[str | None, str], int] = {}  # -> expiry (µs)

    def _state(self, name: str) -> BreakerState:
        return self._states.setdefault(name, BreakerState())

    def _now(self, now_us: int | None) -> int:
        return self._clock() if now_us is None else now_us

    def acquire(
        self,
        name: str,
        limits: Limits,
        permit_id: str,
        deferred_successes: int = 0,
        now_us: int | None = None,
        delivery: Delivery | None = None,
    ) -> Decision:
        with self._lock:
            state = self._state(name)
            now = self._now(now_us)
            deliveries, skip = self._deliver(name, delivery, now) if delivery else (0, "")
            if skip:  # no permit: the task is skipped, but the deferred successes count
                model.apply_deferred(state, limits, now, deferred_successes)
                return Decision(False, None, state.state, None, None, deliveries, skip)
            decision = model.acquire(state, limits, now, permit_id, deferred_successes)
            return dataclasses.replace(decision, deliveries=deliveries)

    def _deliver(self, scope: str | None, delivery: Delivery, now: int) -> tuple[int, Skip]:
        deliveries = 0
        if delivery.count:
            key = (scope, delivery.task_id, delivery.retries, delivery.replays)
            redeliveries = self._deliveries[key] = self._deliveries.get(key, 0) + 1
            deliveries = redeliveries + 1  # the first delivery is never counted
        expiry = self._done.get((scope, delivery.task_id), 0)
        return deliveries, delivery.skip(deliveries, delivery.check_done and expiry > now)

    def deliver(self, scope: str | None, delivery: Delivery) -> tuple[int, Skip]:
        with self._lock:
            return self._deliver(scope, delivery, self._clock())

    def mark_done(self, scope: str | None, task_id: str, ttl: int) -> None:
        with self._lock:
            self._done[(scope, task_id)] = self._clock() + ttl * model.US

    def record(
        self,
        name: str,
        limits: Limits,
        kind: Kind,
        permit_id: str,
        success: bool,
        deferred_successes: int = 0,
        now_us: int | None = None,
    ) -> Change:
        with self._lock:
            state = self._state(name)
            now = self._now(now_us)
            return model.record(state, limits, now, kind, permit_id, success, deferred_successes)

    def release(
        self,
        name: str,
        limits: Limits,
        kind: Kind,
        permit_id: str,
        deferred_successes: int = 0,
        now_us: int | None = None,
    ) -> Change:
        with self._lock:
            state = self._state(name)
            now = self._now(now_us)
            return model.release(state, limits, now, kind, permit_id, deferred_successes)

    def force(self, name: str, limits: Limits, action: Action, now_us: int | None = None) -> Change:
        with self._lock:
            return model.force(self._state(name), action)

    def snapshot(self, name: str, limits: Limits, now_us: int | None = None) -> dict[str, object]:
        with self._lock:
            return model.snapshot(self._state(name), limits, self._now(now_us))

    def names(self) -> set[str]:
        with self._lock:
            return set(self._states)
