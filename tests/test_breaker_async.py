"""``await breaker.acall(...)`` and ``async with breaker.permit():`` under a real event loop, on
the real Redis: the same semantics as ``call``, no round trip where the process knows enough,
round trips off the event loop, and cancellation that judges nothing and leaks no probe."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest
import redis

from celery_resilience import BreakerOpen
from celery_resilience.breaker import Breaker
from celery_resilience.breaker.breaker import FLUSH_INTERVAL
from celery_resilience.breaker.knowledge import MAX_KNOWLEDGE_AGE
from tests.support.faults import FaultProxy
from tests.support.resilience import MakeResilience
from tests.support.round_trips import RoundTrips, lasting_knowledge
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

T = TypeVar("T")


def dep(**options: Any) -> dict[str, Any]:
    """The breakers of these tests: ``dep``, with ``options``."""
    return {"dep": {"failure_threshold": 3, "open_timeout": 30.0, **options}}


class Boom(Exception):
    pass


class NotFound(Exception):
    """A business error: the dependency answered."""


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Each test drives its own event loop: what a Django async view or FastAPI runs on."""
    return asyncio.run(coro)


@pytest.fixture
def make_breaker(make_resilience: MakeResilience) -> Callable[..., Breaker]:
    return lambda **options: make_resilience(breakers=dep(**options)).breaker("dep")


def known(breaker: Breaker) -> Breaker:
    """Wait until the process knows the breaker for sure (its watch live, its view learnt)."""
    deadline = time.monotonic() + 5.0
    while breaker._knowledge.known(breaker.name) is None:
        assert time.monotonic() < deadline, "the breaker's view was never learnt"
        breaker.acquire().release()
        time.sleep(0.005)
    return breaker


async def echo(value: T, delay: float = 0.0) -> T:
    await asyncio.sleep(delay)
    return value


async def boom() -> None:
    await asyncio.sleep(0)
    raise Boom("dependency down")


async def trip(breaker: Breaker, times: int) -> None:
    for _ in range(times):
        with pytest.raises(Boom):
            await breaker.acall(boom)


def half_open(make_breaker: Callable[..., Breaker], **options: Any) -> Breaker:
    breaker = make_breaker(failure_threshold=1, open_timeout=0.2, **options)
    run(trip(breaker, 1))
    wait_for(lambda: breaker.state == "half_open", "the breaker half-open")
    return breaker


# -- the same semantics as call() -------------------------------------------------------------
def test_acall_returns_the_coroutines_result_and_passes_arguments(
    make_breaker: Callable[..., Breaker],
) -> None:
    breaker = make_breaker()
    assert run(breaker.acall(echo, "paid", delay=0.001)) == "paid"


def test_a_failing_acall_propagates_and_is_counted(make_breaker: Callable[..., Breaker]) -> None:
    breaker = make_breaker()
    run(trip(breaker, 2))
    assert breaker.snapshot()["consecutive_failures"] == 2


def test_an_ignored_exception_propagates_but_is_not_counted(
    make_breaker: Callable[..., Breaker],
) -> None:
    breaker = make_breaker(ignore=[NotFound])

    async def not_found() -> None:
        raise NotFound("no such order")

    async def main() -> None:
        for _ in range(5):
            with pytest.raises(NotFound):
                await breaker.acall(not_found)

    run(main())
    snap = breaker.snapshot()
    assert (snap["state"], snap["consecutive_failures"], snap["failures_total"]) == ("closed", 0, 0)


def test_a_slow_success_counts_as_a_failure(make_breaker: Callable[..., Breaker]) -> None:
    breaker = make_breaker(slow_call_seconds=0.05)
    assert run(breaker.acall(echo, "late", delay=0.1)) == "late"
    assert breaker.snapshot()["consecutive_failures"] == 1


def test_a_permit_block_records_an_exception_as_failure_and_admits_like_acquire(
    make_breaker: Callable[..., Breaker],
) -> None:
    breaker = make_breaker(failure_threshold=2)

    async def main() -> None:
        for _ in range(2):
            with pytest.raises(Boom):
                async with breaker.permit():
                    raise Boom("down")
        with pytest.raises(BreakerOpen) as info:
            async with breaker.permit():
                pytest.fail("an open breaker ran the block")
        assert info.value.state == "open"
        assert info.value.retry_after is not None

    run(main())
    assert breaker.snapshot()["opened_total"] == 1


# -- many coroutines at once ------------------------------------------------------------------
def test_many_concurrent_calls_on_a_closed_breaker_cost_no_round_trip(
    make_breaker: Callable[..., Breaker],
) -> None:
    breaker = known(make_breaker())
    sent = RoundTrips(breaker)

    async def main() -> list[int]:
        return list(await asyncio.gather(*(breaker.acall(echo, i, delay=0.01) for i in range(300))))

    began = time.monotonic()
    assert run(main()) == list(range(300))
    elapsed = time.monotonic() - began
    # The promise: held-back successes are flushed at most once per FLUSH_INTERVAL (the calls
    # take a few hundredths of a second here; a busy host may stretch them past the interval).
    assert sent.count <= 1 + int(elapsed / FLUSH_INTERVAL), (sent.count, elapsed)


def test_concurrent_failures_open_the_breaker_exactly_once(make_resilience: MakeResilience) -> None:
    resilience = make_resilience(breakers=dep(failure_threshold=3))
    events: list[tuple[str, str, str]] = []
    resilience.runtime.transition_listeners.append(lambda *event: events.append(event))
    breaker = known(resilience.breaker("dep"))

    async def main() -> list[BaseException | None]:
        calls = (breaker.acall(boom) for _ in range(50))
        return await asyncio.gather(*calls, return_exceptions=True)

    outcomes = run(main())
    assert all(isinstance(o, (Boom, BreakerOpen)) for o in outcomes)
    assert [e[1] for e in events] == ["opened"]
    assert breaker.snapshot()["opened_total"] == 1


def test_an_open_breaker_rejects_without_a_round_trip(
    make_breaker: Callable[..., Breaker], monkeypatch: pytest.MonkeyPatch
) -> None:
    lasting_knowledge(monkeypatch)
    breaker = known(make_breaker(failure_threshold=1))
    called = 0

    async def dependency() -> None:
        nonlocal called
        called += 1

    async def main() -> None:
        await trip(breaker, 1)
        with pytest.raises(BreakerOpen):  # asks Redis once: how long it stays open
            await breaker.acall(dependency)
        sent = RoundTrips(breaker)
        for _ in range(200):
            with pytest.raises(BreakerOpen) as info:
                await breaker.acall(dependency)
            assert info.value.state == "open"
            assert info.value.retry_after is not None
            assert 0 < info.value.retry_after <= 30.0
        assert sent.count == 0

    run(main())
    assert called == 0


def test_a_remembered_rejection_ends_with_the_open_timeout(
    make_breaker: Callable[..., Breaker], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Seconds open: a short open time could pass before the next call reaches Redis, which
    # would admit it as the probe. The view never ages out here: only the rejection's own end
    # may end it.
    lasting_knowledge(monkeypatch)
    breaker = known(make_breaker(failure_threshold=1, open_timeout=2.0))

    async def main() -> str:
        await trip(breaker, 1)
        with pytest.raises(BreakerOpen) as info:
            await breaker.acall(echo, "too early")
        assert info.value.retry_after is not None
        await asyncio.sleep(info.value.retry_after + 0.01)
        return await breaker.acall(echo, "probe")  # asks Redis again: admitted as the probe

    assert run(main()) == "probe"
    assert breaker.state == "closed"


def test_a_remembered_rejection_ends_when_another_process_resets_the_breaker(
    make_resilience: MakeResilience,
) -> None:
    web = known(make_resilience(breakers=dep(failure_threshold=1)).breaker("dep"))
    operator = make_resilience(breakers=dep(failure_threshold=1)).breaker("dep")
    run(trip(web, 1))
    with pytest.raises(BreakerOpen):
        run(web.acall(echo, "rejected"))
    operator.reset()
    wait_for(lambda: web._knowledge.admits("dep") is not None, "the view heard on the feed")
    assert run(web.acall(echo, "admitted")) == "admitted"


def test_half_open_admits_at_most_its_probes_across_concurrent_coroutines(
    make_breaker: Callable[..., Breaker],
) -> None:
    breaker = half_open(make_breaker, half_open_max_calls=2)
    in_flight = most = 0

    async def probe(gate: asyncio.Event) -> str:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await gate.wait()
        in_flight -= 1
        return "ok"

    async def main() -> list[object]:
        gate = asyncio.Event()
        calls = [asyncio.ensure_future(breaker.acall(probe, gate)) for _ in range(20)]
        # every call is rejected or in its block (a probe admitted may still be on its way)
        while sum(c.done() for c in calls) + in_flight < 20:
            await asyncio.sleep(0.01)
        gate.set()
        return await asyncio.gather(*calls, return_exceptions=True)

    outcomes = run(main())
    assert most == 2
    assert outcomes.count("ok") == 2
    assert sum(isinstance(o, BreakerOpen) for o in outcomes) == 18
    assert breaker.state == "closed"  # two probe successes close it


# -- cancellation -----------------------------------------------------------------------------
def test_a_cancelled_probe_counts_as_nothing_and_frees_its_slot(
    make_breaker: Callable[..., Breaker],
) -> None:
    breaker = half_open(make_breaker, half_open_max_calls=1, probe_lease=60.0)

    async def main() -> None:
        started = asyncio.Event()

        async def hang() -> None:
            started.set()
            await asyncio.sleep(3600)

        call = asyncio.ensure_future(breaker.acall(hang))
        await asyncio.wait_for(started.wait(), 10)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    run(main())
    wait_for(  # well before probe_lease
        lambda: breaker.snapshot()["probes_in_flight"] == 0, "the probe's slot freed"
    )
    snap = breaker.snapshot()
    assert (snap["state"], snap["failures_total"]) == ("half_open", 1)  # only the trip's
    assert run(breaker.acall(echo, "next probe")) == "next probe"


def test_a_cancelled_call_on_a_closed_breaker_is_no_failure(
    make_breaker: Callable[..., Breaker],
) -> None:
    breaker = known(make_breaker(failure_threshold=1))

    async def main() -> None:
        call = asyncio.ensure_future(breaker.acall(echo, "never", delay=3600))
        await asyncio.sleep(0.05)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    run(main())
    snap = breaker.snapshot()
    assert (snap["state"], snap["consecutive_failures"], snap["failures_total"]) == ("closed", 0, 0)


def test_cancelled_while_redis_grants_a_probe_releases_the_probe(
    make_breaker: Callable[..., Breaker],
) -> None:
    breaker = half_open(make_breaker, half_open_max_calls=1, probe_lease=60.0)
    admit = breaker.admit
    granted = []
    proceed = threading.Event()

    def slow_admit() -> Any:
        admission = admit()  # the probe is leased in Redis now...
        granted.append(admission.permit)
        proceed.wait(10.0)  # ...and the caller is cancelled before it hears of it
        return admission

    breaker.admit = slow_admit  # type: ignore[method-assign, assignment]

    async def main() -> None:
        call = asyncio.ensure_future(breaker.acall(echo, "never"))
        while not granted:
            await asyncio.sleep(0.005)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    try:
        run(main())
        assert granted[0] is not None
        assert granted[0].kind == "probe"
        assert breaker.snapshot()["probes_in_flight"] == 1
    finally:
        proceed.set()
    wait_for(  # released, not leased out
        lambda: breaker.snapshot()["probes_in_flight"] == 0, "the probe's slot freed"
    )
    assert breaker.state == "half_open"


# -- the event loop never waits for Redis -----------------------------------------------------
def test_a_round_trip_to_a_hanging_redis_does_not_block_the_event_loop(
    make_resilience: MakeResilience,
) -> None:
    with socket.socket() as hanging:  # accepts connections (the backlog), never answers
        hanging.bind(("127.0.0.1", 0))
        hanging.listen(16)
        url = f"redis://127.0.0.1:{hanging.getsockname()[1]}/0"
        breaker = make_resilience(redis_url=url, breakers=dep()).breaker("dep")
        assert breaker._health.policy == "fail_open"
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        async def main() -> tuple[str, float]:
            beat = asyncio.ensure_future(ticker())
            started = time.monotonic()
            result = await breaker.acall(echo, "let through")  # fail_open, after the timeout
            elapsed = time.monotonic() - started
            beat.cancel()
            return result, elapsed

        result, elapsed = run(main())
    assert result == "let through"
    assert elapsed >= 0.4  # the default 0.5 s timeout was waited for...
    # ...while the loop kept running other coroutines: a round trip on the loop would have held
    # it for the whole wait (a tick or none); a busy host may slow the ticks, never stop them.
    assert ticks >= 3, (ticks, elapsed)


#: How a permitted block can end; each gives something back to Redis on a bulkhead.
ENDINGS = ["cancelled", "ignored", "failure", "success", "success-derived"]


@pytest.mark.parametrize("ending", ENDINGS)
def test_every_end_of_an_async_call_leaves_the_event_loop_free_while_redis_hangs(
    make_resilience: MakeResilience, redis_url: str, ending: str
) -> None:
    """A bulkhead's slot is given back (or a derived breaker's family refreshed) in a round
    trip: on a Redis that hangs it waits for the client's timeout, off the event loop."""
    timeout = 3.0
    target = redis.Redis.from_url(redis_url).connection_pool.connection_kwargs
    proxy = FaultProxy(int(target["port"]))
    try:
        res = make_resilience(
            redis_url=f"redis://{proxy.url}/{target['db']}",
            redis_timeout=timeout,
            breakers=dep(
                max_concurrent_calls=None if ending == "success-derived" else 2,
                ignore=[NotFound],
            ),
        )
        breaker = (
            res.breaker("dep", key="host") if ending == "success-derived" else res.breaker("dep")
        )
        if ending == "success-derived":  # its family known, then due a refresh when the call ends
            wait_for(
                lambda: (
                    breaker.call(lambda: True)
                    and breaker._knowledge.admits_member("dep", breaker.name)
                ),
                "the family known",
            )
        gaps: list[float] = []

        async def body(leave: asyncio.Event) -> str:
            await leave.wait()
            if ending == "ignored":
                raise NotFound("no such order")
            if ending == "failure":
                raise Boom("dependency down")
            return "ok"

        async def ticker() -> None:
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        async def main() -> None:
            leave = asyncio.Event()
            call = asyncio.ensure_future(breaker.acall(body, leave))
            await asyncio.sleep(0.3 if ending == "success-derived" else 0.05)
            if ending == "success-derived":  # past half the staleness bound: a refresh is due
                await asyncio.sleep(MAX_KNOWLEDGE_AGE / 2)
            proxy.blackhole()  # Redis hangs from now on
            beat = asyncio.ensure_future(ticker())
            if ending == "cancelled":
                call.cancel()
            else:
                leave.set()
            with contextlib.suppress(BaseException):
                await call
            await asyncio.sleep(timeout * 1.5)  # whatever was sent has met the timeout
            beat.cancel()

        run(main())
    finally:
        proxy.close()
    # The loop ran other coroutines all along: no pause near the client's timeout.
    assert gaps
    assert max(gaps) < timeout / 2, f"the event loop stood still for {max(gaps):.2f}s"
