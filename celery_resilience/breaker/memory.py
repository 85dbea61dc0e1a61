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
from .store import ChangeListener, DeliveryQuestions, Watch, marker_of, succeeded_as
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
        #: The dedup markers: (scope, marker_of(...)) -> ("1" or "1:<task id>" succeeded, or a
        #: claim's token; expiry µs).
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
        delivery: DeliveryQuestions | None = None,
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

    def _deliver(
        self, scope: str | None, delivery: DeliveryQuestions, now: int
    ) -> tuple[int, Skip, int]:
        deliveries = 0
        if delivery.count:
            key = (scope, delivery.task_id, delivery.retries, delivery.replays)
            redeliveries = self._deliveries[key] = self._deliveries.get(key, 0) + 1
            deliveries = redeliveries + 1  # the first delivery is never counted
        token, expiry = self._markers.get((scope, delivery.marker), ("", 0))
        live = delivery.check_done and expiry > now
        done = succeeded_as(token) is not None
        if delivery.key and delivery.check_done and not (live and done):
            # The task id's own success (deduplicate=True before the task had a key) counts too.
            own, own_expiry = self._markers.get((scope, marker_of(delivery.task_id)), ("", 0))
            if own == "1" and own_expiry > now:
                live = done = True
        skip = delivery.skip(deliveries, live and done, live and not done)
        return deliveries, skip, expiry - now if skip == "claimed" else 0

    def _claim(self, scope: str | None, delivery: DeliveryQuestions, now: int) -> None:
        if delivery.claims:
            self._markers[(scope, delivery.marker)] = (delivery.claim, now + delivery.lease_us)

    def deliver(self, scope: str | None, delivery: DeliveryQuestions) -> tuple[int, Skip, int]:
        with self._lock:
            now = self._clock()
            deliveries, skip, wait = self._deliver(scope, delivery, now)
            if not skip:
                self._claim(scope, delivery, now)
            return deliveries, skip, wait

    def mark_done(self, scope: str | None, task_id: str, ttl: int, key: str = "") -> None:
        done = f"1:{task_id}" if key else "1"
        with self._lock:
            self._markers[(scope, marker_of(task_id, key))] = (done, self._clock() + ttl * US)

    def unclaim(self, scope: str | None, task_id: str, claim: str, key: str = "") -> bool:
        marker = marker_of(task_id, key)
        with self._lock:
            token, _ = self._markers.get((scope, marker), ("", 0))
            if token != claim or succeeded_as(token) is not None or not claim:
                return False
            del self._markers[(scope, marker)]
            return True

    def claim_end(self, scope: str | None, task_id: str, key: str = "") -> int:
        with self._lock:
            token, expiry = self._markers.get((scope, marker_of(task_id, key)), ("", 0))
            held = token != "" and succeeded_as(token) is None
            return expiry if held and expiry > self._clock() else 0

    def done_by(self, scope: str | None, key: str) -> str | None:
        with self._lock:
            token, expiry = self._markers.get((scope, marker_of("", key)), ("", 0))
            return succeeded_as(token) if token and expiry > self._clock() else None

    def record(
        self,
        name: str,
        limits: Limits,
        kind: Kind,
        permit_id: str,
        success: bool,
        deferred_successes: int = 0,
        now_us: int | None = None,
        least_open_us: int = 0,
    ) -> Change:
        with self._lock:
            state = self._state(name)
            now = self._now(now_us)
            change = model.record(
                state, limits, now, kind, permit_id, success, deferred_successes, least_open_us
            )
            return self._publish(name, change)

    def spend_retries(
        self,
        name: str,
        limits: Limits,
        ratio: float,
        floor: float,
        wanted: int = 1,
        now_us: int | None = None,
    ) -> int:
        with self._lock:
            state = self._state(name)
            return model.spend_retries(state, limits, self._now(now_us), ratio, floor, wanted)

    def lease_rate(
        self,
        name: str,
        limits: Limits,
        span_us: int,
        burst_us: int,
        refused: int = 0,
        now_us: int | None = None,
    ) -> int:
        with self._lock:
            state = self._state(name)
            return model.lease_rate(state, self._now(now_us), span_us, burst_us, refused)

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

    def force(
        self,
        name: str,
        limits: Limits,
        action: Action,
        now_us: int | None = None,
        window: str = "",
        until_us: int = 0,
    ) -> Change:
        with self._lock:
            now = self._now(now_us)
            change = model.force(self._state(name), action, window, until_us, now)
            return self._publish(name, change)

    def end_window(
        self,
        name: str,
        limits: Limits,
        window: str,
        now_us: int | None = None,
        recorded_us: int = 0,
    ) -> Change:
        with self._lock:
            change = model.end_window(self._state(name), self._now(now_us), window, recorded_us)
            return self._publish(name, change)

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
