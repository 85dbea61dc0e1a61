"""A breaker's fleet-wide ``rate_limit``: the lease script's arithmetic on real Redis (and in
memory, the model it follows), the calls one process and a fleet of processes make against the
limit (never more than the documented bound: ``rate x elapsed + batch x (processes + 1)``), its
cost in round trips, ``RateLimited``, the fate of a task over the rate (every case of it:
``tests/test_fate.py``), and the surfaces. The worker's side is
``tests/test_rate_limit_worker.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import pickle
import threading
import time
from multiprocessing.process import BaseProcess
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest

from celery_resilience import BreakerOpen, RateLimited, ResilienceError
from celery_resilience.backoff import Exponential
from celery_resilience.breaker import Breaker
from celery_resilience.breaker import rate as rate_module
from celery_resilience.breaker.breaker import FLUSH_INTERVAL
from celery_resilience.breaker.permit import Admission
from celery_resilience.breaker.rate import ASK, LEASE_SECONDS, RateLease, batch_size
from celery_resilience.breaker.types import Limits
from celery_resilience.cli.breakers import rate_line
from celery_resilience.config import BreakerConfig, ResilienceConfig
from celery_resilience.delivery.context import Options
from celery_resilience.delivery.ending import Limited, turned_down
from celery_resilience.delivery.fate import Facts, Retry, decide
from celery_resilience.headers import TURNED_AWAY_HEADER
from celery_resilience.metrics import ResilienceCollector
from tests.support.faults import FaultProxy
from tests.support.fleet import (
    BARRIER_TIMEOUT,
    JOIN_TIMEOUT,
    SPAWN,
    fleet_resilience,
    join_all,
    redis_time_us,
    start,
)
from tests.support.forking import run_in_child
from tests.support.metrics_server import parse, value
from tests.support.resilience import MakeResilience
from tests.support.round_trips import RoundTrips, known

T0 = 1_700_000_000_000_000  # a pinned time, microseconds
LIMITS = Limits.of(BreakerConfig())


# -- the lease's arithmetic ------------------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize(
    ("rate", "per_second", "batch"),
    [("2000/s", 2000.0, 200), ("10/s", 10.0, 1), ("600/m", 10.0, 1), ("36000/h", 10.0, 1)],
)
def test_a_lease_covers_a_tenth_of_a_second_of_the_rate_and_at_least_one_call(
    rate: str, per_second: float, batch: int
) -> None:
    config = BreakerConfig(rate_limit=rate)
    assert config.rate_per_second == pytest.approx(per_second)
    assert batch_size(per_second) == batch
    lease = RateLease(per_second)
    assert lease.span_us == round(batch / per_second * 1_000_000)
    assert lease.span_us <= LEASE_SECONDS * 1_000_000 or batch == 1


@pytest.fixture
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> float:
    """The lease's monotonic clock, stopped: a stall of this process between two lines would
    otherwise let the tenths of a second these tests read run out."""
    now = time.monotonic()
    monkeypatch.setattr(rate_module, "time", SimpleNamespace(monotonic=lambda: now))
    return now


@pytest.mark.unit
def test_a_process_spends_its_lease_alone_and_remembers_a_refusal(frozen_clock: float) -> None:
    lease = RateLease(50.0)  # batches of 5, a tenth of a second of the rate
    assert lease.take() == ASK
    lease.granted(frozen_clock - 1.0)  # asked a second ago: the asking call took one
    assert [lease.take() for _ in range(4)] == [0.0] * 4
    assert lease.take() == ASK  # the rate may have earned the next batch since
    assert lease.refused(80_000) == pytest.approx(0.08)
    wait = lease.take()  # turned away here, no round trip
    assert wait == pytest.approx(0.08)  # the clock stopped: what Redis said, to the last µs
    assert lease.reported() == 2  # the refusal Redis gave and the one made here
    assert lease.reported() == 0
    lease.give_back()  # a call taken and not made is spent later
    assert lease.take() == 0.0


@pytest.mark.unit
def test_a_batch_spent_sooner_than_the_rate_earns_the_next_turns_calls_away_unasked(
    frozen_clock: float,
) -> None:
    lease = RateLease(50.0)
    assert lease.take() == ASK
    lease.granted(frozen_clock)
    assert [lease.take() for _ in range(4)] == [0.0] * 4
    wait = lease.take()  # no round trip: no batch before a tenth of a second from the grant
    assert wait == pytest.approx(0.1)  # the clock stopped: a batch's span from the grant
    assert lease.reported() == 1


@pytest.fixture(params=["redis", "memory"])
def store(request: pytest.FixtureRequest, make_resilience: MakeResilience) -> Any:
    res = make_resilience(kind=request.param, breakers={"dep": {}})
    return res.runtime.breaker_store


@pytest.mark.contract
def test_a_batch_is_granted_once_the_rate_earned_it_and_a_refusal_says_when(store: Any) -> None:
    span = 100_000  # a batch earned in 0.1 s; the bucket holds one batch
    assert store.lease_rate("dep", LIMITS, span, span, now_us=T0) == 0
    assert store.lease_rate("dep", LIMITS, span, span, now_us=T0) == span
    assert store.lease_rate("dep", LIMITS, span, span, now_us=T0 + 30_000) == span - 30_000
    assert store.lease_rate("dep", LIMITS, span, span, now_us=T0 + span) == 0
    # an idle rate does not pile up: after ten idle seconds, one batch, not a hundred
    later = T0 + 10_000_000
    assert store.lease_rate("dep", LIMITS, span, span, now_us=later) == 0
    assert store.lease_rate("dep", LIMITS, span, span, now_us=later) == span


@pytest.mark.contract
def test_a_bigger_bucket_grants_a_burst_then_refills_at_the_rate(store: Any) -> None:
    span, burst = 100_000, 300_000
    granted = [store.lease_rate("dep", LIMITS, span, burst, now_us=T0) for _ in range(4)]
    assert granted == [0, 0, 0, span]
    assert store.lease_rate("dep", LIMITS, span, burst, now_us=T0 + span) == 0
    assert store.lease_rate("dep", LIMITS, span, burst, now_us=T0 + span) == span


@pytest.mark.contract
def test_refusals_are_counted_with_the_next_lease_and_a_lease_of_nothing_only_counts(
    store: Any,
) -> None:
    span = 100_000
    assert store.lease_rate("dep", LIMITS, span, span, refused=5, now_us=T0) == 0
    assert store.lease_rate("dep", LIMITS, 0, 0, refused=2, now_us=T0) == span
    assert store.lease_rate("dep", LIMITS, span, span, now_us=T0) == span  # nothing taken
    assert store.snapshot("dep", LIMITS, now_us=T0)["rate_limited_total"] == 7


# -- one process on Redis's clock ------------------------------------------------------------
def limited_breaker(make_resilience: MakeResilience, rate: str, **options: Any) -> Breaker:
    res = make_resilience(breakers={"dep": {"rate_limit": rate, **options}})
    return res.breaker("dep")


def redis_seconds(breaker: Breaker) -> float:
    return float(redis_time_us(breaker._store().client)) / 1_000_000  # type: ignore[attr-defined]


@pytest.mark.integration
def test_threads_of_one_process_never_exceed_the_rate_beyond_two_batches(
    make_resilience: MakeResilience,
) -> None:
    # given: a breaker limited to 1000 calls a second (batches of 100), four threads
    breaker = limited_breaker(make_resilience, "1000/s")
    admitted = [0] * 4
    limited: list[RateLimited] = []
    stop = threading.Event()

    def caller(n: int) -> None:
        while not stop.is_set():
            try:
                breaker.call(lambda: None)
                admitted[n] += 1
            except RateLimited as exc:
                limited.append(exc)

    # when: they call as fast as they can for about half a second
    started = redis_seconds(breaker)
    threads = [threading.Thread(target=caller, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    stop.set()
    for thread in threads:
        thread.join()
    elapsed = redis_seconds(breaker) - started

    # then: never more than the rate over the time, plus the bucket and this process's lease
    batch = breaker.rate.batch if breaker.rate else 0
    assert sum(admitted) <= 1000 * elapsed + 2 * batch
    assert limited, "the callers never met the limit: the test proves nothing"
    # and each refusal says how long until the process's next batch, no more than one's span
    assert all(0 < exc.retry_after <= LEASE_SECONDS for exc in limited)
    breaker.flush()
    assert breaker.snapshot()["rate_limited_total"] == len(limited)


@pytest.mark.integration
def test_a_rate_limit_costs_at_most_a_tenth_of_a_round_trip_per_call(
    make_resilience: MakeResilience,
) -> None:
    # given: a breaker limited to 2000 calls a second, its watch live (until then a call asks
    # Redis for the breaker's state too), warmed up (its first lease taken)
    breaker = known(limited_breaker(make_resilience, "2000/s"))
    breaker.call(lambda: None)
    trips = RoundTrips(breaker)
    # when: 3000 calls, admitted or turned away
    for _ in range(3000):
        with contextlib.suppress(RateLimited):
            breaker.call(lambda: None)
    # then
    assert trips.count <= 0.1 * 3000


@pytest.mark.integration
def test_a_closed_breaker_without_a_rate_limit_asks_nothing(
    make_resilience: MakeResilience,
) -> None:
    res = make_resilience(breakers={"dep": {}})
    breaker = known(res.breaker("dep"))  # its watch live, the breaker learnt closed
    assert breaker.rate is None
    trips = RoundTrips(breaker)
    began = time.monotonic()
    for _ in range(200):
        breaker.call(lambda: None)
    elapsed = time.monotonic() - began
    # Not one command per call: held-back successes flushed at most once per FLUSH_INTERVAL.
    assert trips.count <= 1 + int(elapsed / FLUSH_INTERVAL), (trips.count, elapsed)


@pytest.mark.integration
def test_a_call_the_breaker_rejects_gives_its_rate_back(make_resilience: MakeResilience) -> None:
    breaker = limited_breaker(make_resilience, "1/m")  # batches of one
    breaker.force_open()
    for _ in range(5):
        with pytest.raises(BreakerOpen):
            breaker.call(lambda: None)
    breaker.reset()
    breaker.call(lambda: None)  # the batch the rejections took and gave back
    with pytest.raises(RateLimited) as info:
        breaker.call(lambda: None)
    assert info.value.retry_after > 0


@pytest.mark.integration
def test_an_async_call_over_the_rate_raises_rate_limited(make_resilience: MakeResilience) -> None:
    breaker = limited_breaker(make_resilience, "10/h")

    async def ok() -> int:
        return 1

    async def twice() -> None:
        assert await breaker.acall(ok) == 1
        with pytest.raises(RateLimited) as info:
            await breaker.acall(ok)
        assert 0 < info.value.retry_after <= 360.0

    asyncio.run(twice())


@pytest.mark.integration
def test_each_breaker_named_at_call_time_has_a_limit_of_its_own(
    make_resilience: MakeResilience,
) -> None:
    res = make_resilience(breakers={"hook": {"rate_limit": "1/m"}})
    for host in ("a.example", "b.example"):
        res.breaker("hook", key=host).call(lambda: None)
        with pytest.raises(RateLimited):
            res.breaker("hook", key=host).call(lambda: None)


@pytest.mark.integration
def test_shutdown_counts_the_calls_a_breaker_named_at_call_time_turned_away(
    make_resilience: MakeResilience,
) -> None:
    # given: a breaker named at call time that turned three calls away, counted here only
    res = make_resilience(breakers={"hook": {"rate_limit": "1/m"}})
    breaker = res.breaker("hook", key="a.example")
    breaker.call(lambda: None)
    for _ in range(3):
        with pytest.raises(RateLimited):
            breaker.call(lambda: None)
    assert breaker.snapshot()["rate_limited_total"] == 0
    # when: the worker shuts down
    res.runtime.flush()
    # then: they are in Redis
    assert breaker.snapshot()["rate_limited_total"] == 3


# -- forks and a Redis that hangs ------------------------------------------------------------
@pytest.mark.integration
def test_a_forked_child_leases_though_a_parent_thread_was_asking_at_the_fork() -> None:
    # given: a thread of the parent asking Redis for a batch, its answer not come yet
    lease = RateLease(10.0)
    asking, answer = threading.Event(), threading.Event()

    def slow(refused: int) -> int:
        asking.set()
        answer.wait()
        return 0

    thread = threading.Thread(target=lease.take_or_lease, args=(slow,))
    thread.start()
    try:
        assert asking.wait(BARRIER_TIMEOUT)
        # when: the process forks meanwhile, and the child's first call asks for a batch
        report = run_in_child(lambda: {"wait": lease.take_or_lease(lambda refused: 0)}, 10.0)
    finally:
        answer.set()
        thread.join()
    # then: it asks for its own, rather than wait for a thread it does not have
    assert report == {"wait": 0.0}


#: The client's timeout on the Redis that hangs (seconds), and the threads asking it at once.
HANG_TIMEOUT = 1.0
HANG_THREADS = 8


@pytest.mark.integration
@pytest.mark.parametrize("policy", ["fail_open", "fail_closed"])
def test_threads_waiting_for_a_lease_from_a_hanging_redis_wait_together(
    make_resilience: MakeResilience, redis_url: str, policy: str
) -> None:
    """The threads that wait for one thread's ask get its error: each waits about one client
    timeout, not one more for every thread ahead of it."""
    target = redis.Redis.from_url(redis_url).connection_pool.connection_kwargs
    proxy = FaultProxy(int(target["port"]))
    try:
        # given: a rate-limited breaker that holds no lease, on a Redis that hangs
        res = make_resilience(
            redis_url=f"redis://{proxy.url}/{target['db']}",
            redis_timeout=HANG_TIMEOUT,
            on_redis_error=policy,
            breakers={"dep": {"rate_limit": "100/s"}},
        )
        breaker = res.breaker("dep")
        proxy.blackhole()
        barrier = threading.Barrier(HANG_THREADS)
        took: list[float] = []
        outcomes: list[str] = []

        def caller() -> None:
            barrier.wait(BARRIER_TIMEOUT)
            started = time.monotonic()
            try:
                breaker.call(lambda: None)
                outcomes.append("called")
            except BreakerOpen as exc:
                outcomes.append(exc.state)
            took.append(time.monotonic() - started)

        # when: threads call through it at once
        threads = [threading.Thread(target=caller) for _ in range(HANG_THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(JOIN_TIMEOUT)
    finally:
        proxy.close()
    # then: each is answered as Redis unreachable makes the policy answer...
    expected = "called" if policy == "fail_open" else "unavailable"
    assert outcomes == [expected] * HANG_THREADS
    # ...and their waits overlapped: none waited for the others' asks one after another
    assert max(took) <= 2.5 * HANG_TIMEOUT, sorted(took)


# -- a fleet of processes ------------------------------------------------------------------
FLEET_RATE = "300/s"
FLEET_PROCESSES = 3
FLEET_SECONDS = 1.5


def rate_caller(redis_url: str, prefix: str, barrier: Any, seconds: float) -> None:
    """One process of the fleet: calls through ``dep`` as fast as it can for ``seconds``, and
    reports its calls and the Redis times of its first and last one."""
    breaker = fleet_resilience(redis_url, prefix, {"rate_limit": FLEET_RATE}).breaker("dep")
    client = redis.Redis.from_url(redis_url)
    barrier.wait(BARRIER_TIMEOUT)
    admitted = refused = 0
    first = redis_time_us(client)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            breaker.call(lambda: None)
            admitted += 1
        except RateLimited:
            refused += 1
    last = redis_time_us(client)
    report = {"admitted": admitted, "refused": refused, "first": first, "last": last}
    client.rpush(f"{prefix}:reports", json.dumps(report))


@pytest.mark.integration
@pytest.mark.slow
def test_processes_sharing_a_limit_never_exceed_it_beyond_a_batch_each(
    redis_url: str, redis_client: redis.Redis, key_prefix: str, started: list[BaseProcess]
) -> None:
    # given: three processes sharing a limit of 300 calls a second (batches of 30)
    barrier = SPAWN.Barrier(FLEET_PROCESSES + 1)
    fleet = [
        start(started, rate_caller, redis_url, key_prefix, barrier, FLEET_SECONDS)
        for _ in range(FLEET_PROCESSES)
    ]
    # when: they all call as fast as they can
    barrier.wait(BARRIER_TIMEOUT)
    join_all(fleet)

    # then: the fleet's calls stay within the rate over the time they called, plus one batch
    # in the bucket and one held by each process
    reports = [json.loads(r) for r in redis_client.lrange(f"{key_prefix}:reports", 0, -1)]
    assert len(reports) == FLEET_PROCESSES
    elapsed = (max(r["last"] for r in reports) - min(r["first"] for r in reports)) / 1e6
    admitted = sum(r["admitted"] for r in reports)
    batch = batch_size(300.0)
    print(f"{admitted} calls in {elapsed:.2f}s: {admitted / elapsed:.0f}/s against 300/s")
    assert admitted <= 300 * elapsed + batch * (FLEET_PROCESSES + 1)
    assert sum(r["refused"] for r in reports) > 0, "the fleet never met the limit"


# -- RateLimited, and the fate of a task over the rate ---------------------------------------
@pytest.mark.unit
def test_rate_limited_carries_retry_after_and_is_no_breaker_open() -> None:
    error = RateLimited("dep", 0.25)
    assert (error.breaker, error.retry_after) == ("dep", 0.25)
    assert isinstance(error, ResilienceError)
    assert not isinstance(error, BreakerOpen)  # an open breaker parks; a rate limit waits
    again = pickle.loads(pickle.dumps(error))
    assert (type(again), again.retry_after, str(again)) == (RateLimited, 0.25, str(error))


CONFIG = ResilienceConfig(
    redis_url="memory://",
    max_countdown=100.0,
    breakers={"dep": BreakerConfig(rate_limit="10/s")},
)
TASK = Options(max_retries=3, backoff=Exponential(base=0.1, jitter="full"), breaker="dep")


@pytest.mark.unit
def test_a_task_over_the_rate_waits_in_the_broker_with_no_attempt_spent() -> None:
    limited = RateLimited("dep", 0.4)
    ending = turned_down(Admission(None, limited))
    assert ending == Limited(limited)
    # on its last attempt too: nothing is spent, so nothing runs out
    fate = decide(ending, Facts("t1", retries=3, turned_away=2), TASK, CONFIG)
    assert isinstance(fate, Retry)
    assert fate.retries == 3
    assert fate.countdown >= 0.4
    assert fate.headers == {TURNED_AWAY_HEADER: 3}
    assert not fate.spends


# -- surfaces and settings -------------------------------------------------------------------
@pytest.mark.unit
def test_the_rate_limit_is_off_by_default() -> None:
    assert (BreakerConfig().rate_limit, BreakerConfig().rate_per_second) == (None, None)


@pytest.mark.unit
def test_status_names_a_breakers_rate_limit_and_its_refusals() -> None:
    snap = {"rate_limit": "100/s", "rate_limited_total": 12}
    assert rate_line("payments", snap) == (
        "payments: rate limit 100/s fleet-wide, 12 calls turned away (tasks wait in the broker)"
    )


@pytest.mark.integration
def test_the_metric_counts_the_calls_turned_away(make_resilience: MakeResilience) -> None:
    res = make_resilience(breakers={"dep": {"rate_limit": "5/h"}})
    breaker = res.breaker("dep")
    breaker.call(lambda: None)
    for _ in range(3):
        with pytest.raises(RateLimited):
            breaker.call(lambda: None)
    breaker.flush()
    registry = CollectorRegistry()
    registry.register(ResilienceCollector(res))
    samples = parse(generate_latest(registry).decode())
    assert value(samples, "breaker_rate_limited_total", breaker="dep") == 3
