"""The bulkhead (``max_concurrent_calls``): at most N calls in flight, each slot under a lease.

The store contract runs against both stores with a pinned clock (the memory store and the Lua
scripts on the real Redis); the facade tests run on the real Redis: ``call``/``acquire`` raise
``BulkheadFull``, every way a call ends frees its slot, and what the bulkhead costs in round
trips (with it off, a closed breaker still costs none).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
import redis
from celery import Celery

from celery_resilience import BreakerOpen, BulkheadFull, Resilience
from celery_resilience.breaker import Breaker, MemoryBreakerStore, RedisBreakerStore
from celery_resilience.breaker.store import BreakerStore
from celery_resilience.breaker.types import Decision, Limits
from celery_resilience.config import BreakerConfig

pytestmark = pytest.mark.contract

S = 1_000_000
T0 = 1_700_000_000 * S


class Pinned:
    """One breaker of a store, driven with a clock that moves only when told."""

    def __init__(self, store: BreakerStore, **options: Any) -> None:
        self.store = store
        self.limits = Limits.of(BreakerConfig(**options))
        self.name = f"dep-{uuid.uuid4().hex[:8]}"
        self.now = T0

    def acquire(self) -> tuple[Decision, str]:
        permit_id = uuid.uuid4().hex
        decision = self.store.acquire(self.name, self.limits, permit_id, now_us=self.now)
        return decision, permit_id

    def hold(self) -> str:
        decision, permit_id = self.acquire()
        assert decision.allowed, decision
        return permit_id

    def record(self, permit_id: str, success: bool, kind: str = "normal") -> None:
        self.store.record(self.name, self.limits, kind, permit_id, success, now_us=self.now)  # type: ignore[arg-type]

    def snapshot(self) -> dict[str, Any]:
        return dict(self.store.snapshot(self.name, self.limits, now_us=self.now))


@pytest.fixture(params=["memory", "redis"])
def make(
    request: pytest.FixtureRequest, redis_client: redis.Redis, key_prefix: str
) -> Callable[..., Pinned]:
    def build(**options: Any) -> Pinned:
        store: BreakerStore
        if request.param == "memory":
            store = MemoryBreakerStore(clock=lambda: pinned.now)
        else:
            store = RedisBreakerStore(redis_client, key_prefix)
        pinned = Pinned(store, **options)
        return pinned

    return build


# -- the store contract (memory and Lua) ----------------------------------------------------
def test_at_most_n_permits_are_out_and_the_next_is_turned_away_as_full(
    make: Callable[..., Pinned],
) -> None:
    b = make(max_concurrent_calls=2)
    first, _second = b.hold(), b.hold()
    decision, _ = b.acquire()
    assert (decision.allowed, decision.full, decision.state) == (False, True, "closed")
    assert decision.retry_after_us is None
    snap = b.snapshot()
    assert (snap["calls_in_flight"], snap["rejected_total"], snap["bulkhead_rejected_total"]) == (
        2,
        1,
        1,
    )
    # when: one call ends; then: its slot is free at once
    b.record(first, success=True)
    assert b.snapshot()["calls_in_flight"] == 1
    b.hold()
    assert not b.acquire()[0].allowed


def test_a_released_permit_frees_its_slot(make: Callable[..., Pinned]) -> None:
    b = make(max_concurrent_calls=1)
    held = b.hold()
    assert b.acquire()[0].full
    b.store.release(b.name, b.limits, "normal", held, now_us=b.now)
    b.hold()


def test_a_slot_whose_holder_never_reports_comes_back_when_its_lease_ends(
    make: Callable[..., Pinned],
) -> None:
    b = make(max_concurrent_calls=1, call_lease=2.0)
    b.hold()
    b.now += 2 * S - 1
    assert b.acquire()[0].full  # the lease still runs
    assert b.snapshot()["calls_in_flight"] == 1
    b.now += 1
    assert b.snapshot()["calls_in_flight"] == 0  # a lease that ran out is no call in flight
    b.hold()  # the next acquire clears the dead lease and takes the slot


def test_a_failure_frees_its_slot_and_still_counts_for_the_breaker(
    make: Callable[..., Pinned],
) -> None:
    b = make(max_concurrent_calls=1, failure_threshold=2)
    b.record(b.hold(), success=False)
    b.record(b.hold(), success=False)
    snap = b.snapshot()
    assert (snap["state"], snap["calls_in_flight"]) == ("open", 0)


def test_a_rejection_by_the_open_breaker_is_not_a_bulkhead_rejection(
    make: Callable[..., Pinned],
) -> None:
    b = make(max_concurrent_calls=3, failure_threshold=1)
    b.record(b.hold(), success=False)
    decision, _ = b.acquire()
    assert (decision.allowed, decision.full, decision.state) == (False, False, "open")
    snap = b.snapshot()
    assert (snap["rejected_total"], snap["bulkhead_rejected_total"]) == (1, 0)


def test_calls_in_flight_when_the_breaker_trips_keep_their_slots_and_a_probe_needs_one_too(
    make: Callable[..., Pinned],
) -> None:
    b = make(max_concurrent_calls=2, failure_threshold=1, open_timeout=1.0, half_open_max_calls=2)
    failing, hanging = b.hold(), b.hold()
    b.record(failing, success=False)  # opened; the hanging call is still in flight
    assert b.snapshot()["calls_in_flight"] == 1
    b.now += 1 * S
    probe, probe_id = b.acquire()
    assert (probe.allowed, probe.kind, probe.transition) == (True, "probe", "half_opened")
    # a second probe is allowed by half_open_max_calls but not by the bulkhead: 2 in flight
    second, _ = b.acquire()
    assert (second.allowed, second.full, second.state) == (False, True, "half_open")
    b.record(hanging, success=True)  # a late normal success: frees its slot, judges nothing
    b.record(probe_id, success=True, kind="probe")
    assert b.snapshot()["calls_in_flight"] == 0
    assert b.snapshot()["state"] == "half_open"  # one of two probes succeeded so far


def test_forced_closed_still_holds_the_bulkhead_and_a_reset_keeps_the_slots(
    make: Callable[..., Pinned],
) -> None:
    b = make(max_concurrent_calls=1)
    held = b.hold()
    b.store.force(b.name, b.limits, "closed", now_us=b.now)
    assert b.acquire()[0].full
    b.store.force(b.name, b.limits, "reset", now_us=b.now)
    assert b.acquire()[0].full  # the call is still in flight, whatever the operator ordered
    b.record(held, success=True)
    b.hold()


def test_without_a_bulkhead_nothing_is_leased_for_a_normal_permit(
    make: Callable[..., Pinned],
) -> None:
    b = make()
    for _ in range(5):
        b.hold()
    snap = b.snapshot()
    assert (snap["calls_in_flight"], snap["bulkhead_rejected_total"]) == (0, 0)


# -- the facade, on the real Redis ----------------------------------------------------------
@pytest.fixture
def make_breaker(redis_url: str, key_prefix: str) -> Iterator[Callable[..., Breaker]]:
    made: list[Resilience] = []

    def build(**options: Any) -> Breaker:
        app = Celery("t", broker=redis_url, set_as_current=False)
        app.conf.resilience_key_prefix = key_prefix
        app.conf.resilience_redis_url = redis_url
        app.conf.resilience_breakers = {"dep": {"failure_threshold": 3, **options}}
        resilience = Resilience(app)
        made.append(resilience)
        return resilience.breaker("dep")

    yield build
    for resilience in made:
        resilience.runtime.close()


def test_call_raises_bulkhead_full_without_calling_when_every_slot_is_taken(
    make_breaker: Callable[..., Breaker],
) -> None:
    breaker = make_breaker(max_concurrent_calls=2)
    held = [breaker.acquire(), breaker.acquire()]
    calls: list[int] = []
    with pytest.raises(BulkheadFull) as info:
        breaker.call(calls.append, 1)
    assert calls == []
    assert isinstance(info.value, BreakerOpen)  # code that handles a rejection handles this one
    assert (info.value.breaker, info.value.state, info.value.retry_after) == ("dep", "closed", None)
    assert "bulkhead is full" in str(info.value)
    with pytest.raises(BulkheadFull):
        breaker.acquire()
    held[0].success()
    assert breaker.call(lambda: "ran") == "ran"


def test_every_way_a_call_ends_frees_its_slot(make_breaker: Callable[..., Breaker]) -> None:
    class Ignored(Exception):
        pass

    class Boom(Exception):
        pass

    breaker = make_breaker(max_concurrent_calls=1, ignore=[Ignored], failure_threshold=10)

    def raise_(exc: Exception) -> None:
        raise exc

    assert breaker.call(lambda: 1) == 1  # a success (never held back: it frees a slot)
    with pytest.raises(Boom):
        breaker.call(raise_, Boom())  # a failure
    with pytest.raises(Ignored):
        breaker.call(raise_, Ignored())  # an ignored error: released
    permit = breaker.acquire()
    permit.release()  # the caller's own error
    assert breaker.snapshot()["calls_in_flight"] == 0
    breaker.acquire()


def test_a_success_on_a_breaker_named_at_call_time_frees_its_slot(
    redis_url: str, key_prefix: str
) -> None:
    # given: a bulkhead of one on a breaker named at call time (its family known after a call)
    app = Celery("t", broker=redis_url, set_as_current=False)
    app.conf.resilience_key_prefix = key_prefix
    app.conf.resilience_redis_url = redis_url
    app.conf.resilience_breakers = {"hook": {"max_concurrent_calls": 1}}
    resilience = Resilience(app)
    host = resilience.breaker("hook", key="example.org")
    try:
        # when: calls succeed one after the other
        results = [host.call(lambda i=i: i) for i in range(5)]

        # then: each success gave its slot back (none held back with the family's successes)
        assert results == [0, 1, 2, 3, 4]
        assert host.snapshot()["calls_in_flight"] == 0
    finally:
        resilience.runtime.close()


def test_what_a_dead_holder_took_is_released_by_its_permit_id_whatever_its_kind(
    make_breaker: Callable[..., Breaker],
) -> None:
    # given: a bulkhead slot, then a half-open probe (with its slot), each taken under an id
    # another process knows (a task delivery's token, which the worker's main process holds)
    breaker = make_breaker(max_concurrent_calls=1, failure_threshold=1, open_timeout=0.2)
    assert breaker.admit(None, "slot-holder").permit is not None
    breaker.release_lost("slot-holder")  # its pool child died mid-call
    assert breaker.snapshot()["calls_in_flight"] == 0
    with pytest.raises(RuntimeError):
        breaker.call(_raise, RuntimeError("down"))  # trips it
    time.sleep(0.25)
    probe = breaker.admit(None, "probe-holder").permit
    assert probe is not None
    assert probe.kind == "probe"

    # when: the process that held the probe is gone, and another releases it by its id
    breaker.release_lost("probe-holder")

    # then: the probe's lease and the slot are free at once, and nothing was judged
    snap = breaker.snapshot()
    assert (snap["state"], snap["probes_in_flight"], snap["calls_in_flight"]) == (
        "half_open",
        0,
        0,
    )
    assert (snap["calls_total"], snap["failures_total"]) == (1, 1)  # the trip's call only
    assert breaker.call(lambda: "next probe") == "next probe"


def _raise(exc: Exception) -> None:
    raise exc


def test_threads_never_have_more_than_n_calls_in_flight(
    make_breaker: Callable[..., Breaker],
) -> None:
    breaker = make_breaker(max_concurrent_calls=3)
    lock = threading.Lock()
    inflight, peak, ran, full = 0, 0, 0, 0

    def dependency() -> None:
        nonlocal inflight, peak, ran
        with lock:
            inflight += 1
            peak, ran = max(peak, inflight), ran + 1
        time.sleep(0.01)
        with lock:
            inflight -= 1

    def worker() -> None:
        nonlocal full
        for _ in range(30):
            try:
                breaker.call(dependency)
            except BulkheadFull:
                with lock:
                    full += 1

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert peak <= 3
    assert ran + full == 8 * 30
    assert full > 0
    assert ran > 0
    snap = breaker.snapshot()
    assert snap["bulkhead_rejected_total"] == full
    assert snap["calls_in_flight"] == 0


class CommandCount:
    """Commands this process sends through ``redis.Redis`` (the Redis server is shared: its own
    statistics count every other client too)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sent = 0
        original = redis.Redis.execute_command

        def counted(client: redis.Redis, *args: Any, **options: Any) -> Any:
            self.sent += 1
            return cast(Any, original)(client, *args, **options)

        monkeypatch.setattr(redis.Redis, "execute_command", counted)


def settled(breaker: Breaker) -> Breaker:
    """The process watches and knows the breaker (as after its first call)."""
    breaker.call(lambda: None)
    deadline = time.monotonic() + 5.0
    while breaker._knowledge.admits("dep") is None:
        assert time.monotonic() < deadline
        breaker.call(lambda: None)
        time.sleep(0.01)
    return breaker


def test_with_the_bulkhead_each_call_costs_two_round_trips_and_without_it_none(
    make_breaker: Callable[..., Breaker], monkeypatch: pytest.MonkeyPatch
) -> None:
    off = settled(make_breaker())
    on = make_breaker(max_concurrent_calls=10)
    on.call(lambda: None)
    count = CommandCount(monkeypatch)
    for _ in range(100):
        off.call(lambda: None)
    assert count.sent <= 1  # at most one flush of held-back successes

    count.sent = 0
    for _ in range(100):
        on.call(lambda: None)
    assert count.sent == 200  # one EVALSHA takes the slot, one records the outcome and frees it


def test_coroutines_share_the_bulkhead_and_a_cancelled_call_frees_its_slot(
    make_breaker: Callable[..., Breaker],
) -> None:
    breaker = make_breaker(max_concurrent_calls=2)
    inflight = peak = 0

    async def scenario() -> None:
        gate = asyncio.Event()

        async def dependency() -> None:
            nonlocal inflight, peak
            inflight += 1
            peak = max(peak, inflight)
            try:
                await gate.wait()
            finally:
                inflight -= 1

        async def until(condition: Callable[[], bool]) -> None:
            deadline = time.monotonic() + 5.0
            while not condition():
                assert time.monotonic() < deadline, "the condition never held"
                await asyncio.sleep(0.005)

        first, second = (asyncio.create_task(breaker.acall(dependency)) for _ in range(2))
        await until(lambda: inflight == 2)
        with pytest.raises(BulkheadFull):
            await breaker.acall(dependency)
        first.cancel()  # judges nothing, and gives its slot back
        with contextlib.suppress(asyncio.CancelledError):
            await first
        await until(lambda: breaker.snapshot()["calls_in_flight"] == 1)
        third = asyncio.create_task(breaker.acall(dependency))
        await until(lambda: inflight == 2)
        gate.set()
        await asyncio.gather(second, third)

    asyncio.run(scenario())
    assert peak == 2
    snap = breaker.snapshot()
    assert (snap["calls_in_flight"], snap["failures_total"], snap["bulkhead_rejected_total"]) == (
        0,
        0,
        1,
    )
