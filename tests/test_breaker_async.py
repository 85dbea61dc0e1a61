"""``await breaker.acall(...)`` and ``async with breaker.permit():`` under a real event loop, on
the real Redis: the same semantics as ``call``, no round trip where the process knows enough,
round trips off the event loop, and cancellation that judges nothing and leaks no probe."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest
from celery import Celery

from celery_resilience import BreakerOpen, Resilience
from celery_resilience.breaker import Breaker
from tests.support.round_trips import RoundTrips

pytestmark = pytest.mark.integration

T = TypeVar("T")
MakeResilience = Callable[..., Resilience]


class Boom(Exception):
    pass


class NotFound(Exception):
    """A business error: the dependency answered."""


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Each test drives its own event loop: what a Django async view or FastAPI runs on."""
    return asyncio.run(coro)


@pytest.fixture
def make_resilience(redis_url: str, key_prefix: str) -> Iterator[MakeResilience]:
    made: list[Resilience] = []

    def make(url: str = redis_url, **options: Any) -> Resilience:
        app = Celery("t", broker=redis_url, set_as_current=False)
        app.conf.resilience_key_prefix = key_prefix
        app.conf.resilience_redis_url = url
        app.conf.resilience_breakers = {
            "dep": {"failure_threshold": 3, "open_timeout": 30.0, **options}
        }
        resilience = Resilience(app)
        made.append(resilience)
        return resilience

    yield make
    for resilience in made:
        resilience.runtime.close()


@pytest.fixture
def make_breaker(make_resilience: MakeResilience) -> Callable[..., Breaker]:
    return lambda **options: make_resilience(**options).breaker("dep")


def known(breaker: Breaker) -> Breaker:
    """Wait until the process knows the breaker for sure (its watch live, its view learnt)."""
    deadline = time.monotonic() + 5.0
    while breaker._knowledge.known(breaker.name) is None:
        assert time.monotonic() < deadline, "the breaker's view was never learnt"
        breaker.acquire().release()
        time.sleep(0.005)
    return breaker


def wait_for(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.005)


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
    wait_for(lambda: breaker.state == "half_open")
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

    assert run(main()) == list(range(300))
    assert sent.count <= 1  # at most one flush of held-back successes


def test_concurrent_failures_open_the_breaker_exactly_once(make_resilience: MakeResilience) -> None:
    resilience = make_resilience(failure_threshold=3)
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


def test_an_open_breaker_rejects_without_a_round_trip(make_breaker: Callable[..., Breaker]) -> None:
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
    make_breaker: Callable[..., Breaker],
) -> None:
    breaker = known(make_breaker(failure_threshold=1, open_timeout=0.3))

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
    web = known(make_resilience(failure_threshold=1).breaker("dep"))
    operator = make_resilience(failure_threshold=1).breaker("dep")
    run(trip(web, 1))
    with pytest.raises(BreakerOpen):
        run(web.acall(echo, "rejected"))
    operator.reset()
    wait_for(lambda: web._knowledge.admits("dep") is not None)  # heard on the change feed
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
        while sum(c.done() for c in calls) < 18:  # every call but the probes is rejected
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
    wait_for(lambda: breaker.snapshot()["probes_in_flight"] == 0)  # not after probe_lease
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


def test_cancelled_while_redis_grants_a_probe_gives_the_probe_back(
    make_breaker: Callable[..., Breaker],
) -> None:
    breaker = half_open(make_breaker, half_open_max_calls=1, probe_lease=60.0)
    admit = breaker.admit
    granted = []

    def slow_admit() -> Any:
        admission = admit()  # the probe is leased in Redis now...
        granted.append(admission.permit)
        time.sleep(0.2)  # ...and the caller is cancelled before it hears of it
        return admission

    breaker.admit = slow_admit  # type: ignore[method-assign, assignment]

    async def main() -> None:
        call = asyncio.ensure_future(breaker.acall(echo, "never"))
        while not granted:
            await asyncio.sleep(0.005)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    run(main())
    assert granted[0] is not None
    assert granted[0].kind == "probe"
    assert breaker.snapshot()["probes_in_flight"] == 1
    wait_for(lambda: breaker.snapshot()["probes_in_flight"] == 0)  # given back, not leased out
    assert breaker.state == "half_open"


# -- the event loop never waits for Redis -----------------------------------------------------
def test_a_round_trip_to_a_hanging_redis_does_not_block_the_event_loop(
    make_resilience: MakeResilience,
) -> None:
    with socket.socket() as hanging:  # accepts connections (the backlog), never answers
        hanging.bind(("127.0.0.1", 0))
        hanging.listen(16)
        url = f"redis://127.0.0.1:{hanging.getsockname()[1]}/0"
        breaker = make_resilience(url=url).breaker("dep")
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
    assert ticks >= elapsed / 0.01 * 0.5  # ...while the loop kept running other coroutines
