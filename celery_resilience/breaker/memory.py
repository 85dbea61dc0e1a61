"""In-process breaker store: the model behind a lock, for tests and single-process apps.

The lock is held only for the decision itself, never around the protected call.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from . import model
from .store import ChangeListener, Delivery, Watch
from .types import US, Action, BreakerState, Change, Decision, Kind, Limits, Skip

R = TypeVar("R", Decision, Change)


def _wall_clock_us() -> int:
    return time.time_ns() // 1000


class MemoryBreakerStore:
    """Every breaker of one process; ``clock`` returns microseconds."""

    def __init__(self, clock: Callable[[], int] = _wall_clock_us) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._states: dict[str, BreakerState] = {}
        self._deliveries: dict[tuple[str | None, str, int, int], int] = {}
        #: The dedup markers: (scope, task id) -> ("1" succeeded, or a claim's token; expiry µs).
        self._markers: dict[tuple[str | None, str], tuple[str, int]] = {}
        self._listeners: list[ChangeListener] = []
        self._seen: dict[str, int] = {}  # breaker -> the last version published

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
            deliveries, skip, wait = self._deliver(name, delivery, now) if delivery else (0, "", 0)
            if skip:  # no permit: the task is skipped, but the deferred successes count
                decision = model.skip(state, limits, now, deferred_successes)
            else:
                decision = model.acquire(state, limits, now, permit_id, deferred_successes)
                if decision.allowed and delivery is not None:
                    self._claim(name, delivery, now)
            decision = dataclasses.replace(
                decision, deliveries=deliveries, skip=skip, claim_wait_us=wait
            )
            return self._publish(name, decision)

    def _deliver(self, scope: str | None, delivery: Delivery, now: int) -> tuple[int, Skip, int]:
        deliveries = 0
        if delivery.count:
            key = (scope, delivery.task_id, delivery.retries, delivery.replays)
            redeliveries = self._deliveries[key] = self._deliveries.get(key, 0) + 1
            deliveries = redeliveries + 1  # the first delivery is never counted
        token, expiry = self._markers.get((scope, delivery.task_id), ("", 0))
        live = delivery.check_done and expiry > now
        skip = delivery.skip(deliveries, live and token == "1", live and token != "1")
        return deliveries, skip, expiry - now if skip == "claimed" else 0

    def _claim(self, scope: str | None, delivery: Delivery, now: int) -> None:
        if delivery.claims:
            self._markers[(scope, delivery.task_id)] = (delivery.claim, now + delivery.lease_us)

    def deliver(self, scope: str | None, delivery: Delivery) -> tuple[int, Skip, int]:
        with self._lock:
            now = self._clock()
            deliveries, skip, wait = self._deliver(scope, delivery, now)
            if not skip:
                self._claim(scope, delivery, now)
            return deliveries, skip, wait

    def mark_done(self, scope: str | None, task_id: str, ttl: int) -> None:
        with self._lock:
            self._markers[(scope, task_id)] = ("1", self._clock() + ttl * US)

    def unclaim(self, scope: str | None, task_id: str, claim: str) -> bool:
        with self._lock:
            token, _ = self._markers.get((scope, task_id), ("", 0))
            if token != claim or token == "1" or not claim:
                return False
            del self._markers[(scope, task_id)]
            return True

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
            change = model.record(state, limits, now, kind, permit_id, success, deferred_successes)
            return self._publish(name, change)

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
            change = model.release(state, limits, now, kind, permit_id, deferred_successes)
            return self._publish(name, change)

    def force(self, name: str, limits: Limits, action: Action, now_us: int | None = None) -> Change:
        with self._lock:
            return self._publish(name, model.force(self._state(name), action))

    def snapshot(self, name: str, limits: Limits, now_us: int | None = None) -> dict[str, object]:
        with self._lock:
            return model.snapshot(self._state(name), limits, self._now(now_us))

    def watch(
        self, on_change: ChangeListener, on_live: Callable[[], None], on_lost: Callable[[], None]
    ) -> Watch:
        """In one process every change is seen as it is made: the feed is live at once."""
        with self._lock:
            self._listeners.append(on_change)
        on_live()
        return _MemoryWatch(self, on_change)

    def _publish(self, name: str, result: R) -> R:
        """Tell the watchers of a change of view (called with the lock held, as Redis does)."""
        state = self._states[name]
        if state.version != self._seen.get(name, 0):
            self._seen[name] = state.version
            for listener in list(self._listeners):
                listener(name, result.version, result.state, result.streak, result.epoch, None)
        return result

    def names(self) -> set[str]:
        with self._lock:
            return set(self._states)


class _MemoryWatch:
    def __init__(self, store: MemoryBreakerStore, listener: ChangeListener) -> None:
        self.store, self.listener = store, listener

    def close(self) -> None:
        with self.store._lock:
            if self.listener in self.store._listeners:
                self.store._listeners.remove(self.listener)
