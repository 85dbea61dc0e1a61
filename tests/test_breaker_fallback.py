"""``Breaker.call(fn, ..., fallback=...)`` and ``acall`` on the real Redis: a call the breaker
refuses (open, bulkhead full, over its rate limit, Redis away with ``fail_closed``) returns the
fallback's value, logged and counted; a call it admits runs ``fn``, whose own failure is raised,
never replaced."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest

from celery_resilience import BreakerOpen, BulkheadFull, RateLimited, Resilience
from celery_resilience.breaker.fallback import FallbackTally
from celery_resilience.metrics import ResilienceCollector
from tests.support.forking import run_in_child
from tests.support.redis_server import free_port
from tests.support.resilience import MakeResilience
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

LOGGER = "celery_resilience.breaker"


class Boom(Exception):
    pass


def boom() -> None:
    raise Boom("dependency down")


def dep(**options: Any) -> dict[str, Any]:
    return {"dep": {"failure_threshold": 3, "open_timeout": 30.0, **options}}


def fallbacks(resilience: Resilience) -> dict[tuple[str, str], float]:
    """``celery_resilience_breaker_fallbacks_total`` as a scrape reads it, by (breaker, reason)."""
    found: dict[tuple[str, str], float] = {}
    for family in ResilienceCollector(resilience).collect():
        for sample in family.samples:
            if sample.name == "celery_resilience_breaker_fallbacks_total":
                found[sample.labels["breaker"], sample.labels["reason"]] = sample.value
    return found


def keeping(given: list[BreakerOpen], value: str) -> Callable[[BreakerOpen], str]:
    """A fallback that keeps the refusal it is given and returns ``value``."""

    def fallback(refusal: BreakerOpen) -> str:
        given.append(refusal)
        return value

    return fallback


class Calls:
    """A dependency that counts its calls."""

    def __init__(self) -> None:
        self.made = 0

    def __call__(self, value: str = "fresh") -> str:
        self.made += 1
        return value


def test_a_forced_open_breaker_returns_the_fallbacks_value_logs_and_counts_it(
    make_resilience: MakeResilience, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a breaker forced open
    caplog.set_level(logging.INFO, logger=LOGGER)
    resilience = make_resilience(breakers=dep())
    breaker = resilience.breaker("dep")
    breaker.force_open()
    dependency = Calls()
    given: list[BreakerOpen] = []

    # When a call with a fallback is made through it
    value = breaker.call(dependency, "fresh", fallback=keeping(given, "cached"))

    # Then the fallback's value is returned, given the refusal; the dependency was not called
    assert value == "cached"
    assert dependency.made == 0
    (refusal,) = given
    assert (type(refusal), refusal.breaker, refusal.state) == (BreakerOpen, "dep", "forced_open")
    # And one log line names the breaker and why; the metric counts it
    lines = [r.getMessage() for r in caplog.records if "fallback" in r.getMessage()]
    assert len(lines) == 1
    assert "'dep'" in lines[0]
    assert "breaker_open" in lines[0]
    wait_for(lambda: fallbacks(resilience) == {("dep", "breaker_open"): 1.0}, "the count")


def test_an_outage_of_fallbacks_logs_one_info_line_as_it_starts_and_one_as_it_ends(
    make_resilience: MakeResilience, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    resilience = make_resilience(breakers=dep())
    breaker = resilience.breaker("dep")

    def info() -> list[str]:
        lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
        return [line for line in lines if "fallback" in line or "fell back" in line]

    def per_call() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "refused a call" in r.getMessage()]

    # Given a breaker forced open, called 20 times with a fallback
    breaker.force_open()
    caplog.clear()
    for _ in range(20):
        assert breaker.call(Calls(), fallback=lambda refusal: "cached") == "cached"

    # Then one INFO line says the breaker falls back, naming why; each further call has a DEBUG
    # line
    (started,) = info()
    assert "breaker_open" in started
    assert len(per_call()) == 19
    assert {r.levelno for r in per_call()} == {logging.DEBUG}

    # When the breaker admits a call again, one INFO line says so, with how many fell back
    breaker.reset()
    caplog.clear()
    for _ in range(3):
        assert breaker.call(Calls(), "fresh", fallback=lambda refusal: "cached") == "fresh"
    (ended,) = info()
    assert "20" in ended

    # And the next outage is announced again, once
    breaker.force_open()
    caplog.clear()
    for _ in range(3):
        breaker.call(Calls(), fallback=lambda refusal: "cached")
    assert len(info()) == 1


def test_a_call_over_the_rate_limit_returns_the_fallbacks_value_given_the_wait(
    make_resilience: MakeResilience,
) -> None:
    # Given a breaker that admits one call an hour, and that call made
    resilience = make_resilience(breakers=dep(rate_limit="1/h"))
    breaker = resilience.breaker("dep")
    dependency = Calls()
    assert breaker.call(dependency, "fresh") == "fresh"

    # When the next call comes with a fallback
    given: list[Any] = []
    value = breaker.call(dependency, "fresh", fallback=keeping(given, "cached"))

    # Then the fallback answers, given the refusal and how long until the next slot
    assert (value, dependency.made) == ("cached", 1)
    (refusal,) = given
    assert isinstance(refusal, RateLimited)
    assert 0 < refusal.retry_after <= 3600
    wait_for(lambda: fallbacks(resilience) == {("dep", "rate_limited"): 1.0}, "the count")


def test_a_tripped_breaker_falls_back_and_every_fallback_is_counted(
    make_resilience: MakeResilience,
) -> None:
    # Given a breaker tripped by failures of its dependency
    resilience = make_resilience(breakers=dep())
    breaker = resilience.breaker("dep")
    for _ in range(3):
        with pytest.raises(Boom):
            breaker.call(boom, fallback=lambda refusal: "unused")
    assert breaker.state == "open"

    # When 25 calls with a fallback follow
    values = [breaker.call(boom, fallback=lambda refusal: refusal.retry_after) for _ in range(25)]

    # Then each returned its fallback's value (the refusal says how long the breaker stays open)
    assert all(v is not None and 0 < v <= 30.0 for v in values)
    wait_for(lambda: fallbacks(resilience) == {("dep", "breaker_open"): 25.0}, "25 counted")


def test_a_full_bulkhead_falls_back_with_its_own_reason(make_resilience: MakeResilience) -> None:
    # Given a bulkhead of one slot, taken by a call in flight
    resilience = make_resilience(breakers=dep(max_concurrent_calls=1))
    breaker = resilience.breaker("dep")
    dependency = Calls()
    with breaker.acquire():
        # When another call with a fallback is made
        given: list[BreakerOpen] = []
        value = breaker.call(dependency, fallback=keeping(given, "busy"))

    # Then it fell back, not calling the dependency, and says the bulkhead was full
    assert (value, dependency.made) == ("busy", 0)
    assert isinstance(given[0], BulkheadFull)
    wait_for(lambda: fallbacks(resilience) == {("dep", "bulkhead_full"): 1.0}, "the count")
    # And once the slot is free the dependency is called again
    assert breaker.call(dependency, "again", fallback=lambda r: "busy") == "again"


def test_a_closed_breaker_returns_the_calls_value_and_never_calls_the_fallback(
    make_resilience: MakeResilience,
) -> None:
    breaker = make_resilience(breakers=dep()).breaker("dep")
    called: list[BreakerOpen] = []
    assert breaker.call(lambda a, b=0: a + b, 2, b=3, fallback=called.append) == 5
    assert called == []


def test_a_failure_of_the_call_is_raised_and_recorded_not_replaced_by_the_fallback(
    make_resilience: MakeResilience,
) -> None:
    # Given a closed breaker
    resilience = make_resilience(breakers=dep())
    breaker = resilience.breaker("dep")

    # When the call itself fails, a fallback given
    with pytest.raises(Boom):
        breaker.call(boom, fallback=lambda refusal: "cached")

    # Then the failure was raised and counted by the breaker; no fallback was counted
    assert breaker.snapshot()["consecutive_failures"] == 1
    assert fallbacks(resilience) == {}


def test_a_refusal_raised_inside_the_call_is_the_calls_failure_not_a_fallback(
    make_resilience: MakeResilience,
) -> None:
    # Given an outer breaker, closed, whose call goes through an inner breaker forced open
    resilience = make_resilience(breakers={**dep(), "inner": {}})
    inner = resilience.breaker("inner")
    inner.force_open()

    # When the inner refusal leaves the outer call: it is raised (the outer breaker admitted)
    with pytest.raises(BreakerOpen) as raised:
        resilience.breaker("dep").call(inner.call, boom, fallback=lambda refusal: "outer")
    assert raised.value.breaker == "inner"


def test_fallback_must_be_callable_and_is_not_passed_to_the_function(
    make_resilience: MakeResilience,
) -> None:
    # Given a function with its own parameter named fallback
    breaker = make_resilience(breakers=dep()).breaker("dep")

    def lookup(order: str, fallback: str = "none") -> str:
        return f"{order}/{fallback}"

    # When that keyword is passed to call(), it is call()'s own: a value that is not callable
    # is refused, naming the way out
    with pytest.raises(TypeError, match=r"functools\.partial"):
        breaker.call(lookup, "o-1", fallback="cached")  # type: ignore[arg-type]
    # And a function wrapped with its keyword gets it
    assert breaker.call(functools.partial(lookup, fallback="cached"), "o-1") == "o-1/cached"


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_acall_returns_a_sync_or_async_fallbacks_value_when_refused(
    make_resilience: MakeResilience, kind: str
) -> None:
    # Given a breaker forced open
    resilience = make_resilience(breakers=dep())
    breaker = resilience.breaker("dep")
    breaker.force_open()
    awaited: list[str] = []

    async def dependency() -> str:
        awaited.append("called")
        return "fresh"

    async def async_fallback(refusal: BreakerOpen) -> str:
        await asyncio.sleep(0)
        return f"async {refusal.state}"

    fallback: Callable[[BreakerOpen], Any]
    fallback = async_fallback if kind == "async" else (lambda refusal: f"sync {refusal.state}")

    # When calls are awaited through it, twice (the second refusal is remembered: no round trip)
    async def calls() -> list[str]:
        return [await breaker.acall(dependency, fallback=fallback) for _ in range(2)]

    # Then each returned the fallback's value, the dependency never awaited
    assert asyncio.run(calls()) == [f"{kind} forced_open"] * 2
    assert awaited == []
    wait_for(lambda: fallbacks(resilience) == {("dep", "breaker_open"): 2.0}, "both counted")


def test_acall_admitted_returns_the_value_and_raises_the_calls_failure(
    make_resilience: MakeResilience,
) -> None:
    breaker = make_resilience(breakers=dep()).breaker("dep")

    async def fresh() -> str:
        return "fresh"

    async def failing() -> str:
        raise Boom("dependency down")

    async def calls() -> str:
        with pytest.raises(Boom):
            await breaker.acall(failing, fallback=lambda refusal: "cached")
        return await breaker.acall(fresh, fallback=lambda refusal: "cached")

    assert asyncio.run(calls()) == "fresh"
    assert breaker.snapshot()["consecutive_failures"] == 0  # the success ended the streak


@pytest.mark.parametrize("policy", ["fail_open", "fail_closed"])
def test_with_redis_unreachable_the_redis_error_policy_decides(
    make_resilience: MakeResilience, policy: str
) -> None:
    # Given a breaker whose Redis refuses connections
    url = f"redis://127.0.0.1:{free_port()}/0"
    resilience = make_resilience(
        breakers=dep(), redis_url=url, on_redis_error=policy, redis_timeout=0.2
    )
    breaker = resilience.breaker("dep")
    dependency = Calls()

    # When a call with a fallback is made
    value = breaker.call(dependency, "fresh", fallback=lambda refusal: refusal.state)

    # Then fail_open runs the call (as without a fallback); fail_closed refuses it, and the
    # refusal (state "unavailable") falls back
    if policy == "fail_open":
        assert (value, dependency.made) == ("fresh", 1)
    else:
        assert (value, dependency.made) == ("unavailable", 0)


def test_fallback_counts_made_while_a_send_is_under_way_go_in_the_next_send() -> None:
    # Given a tally whose sends run when the test says (a pool thread's work, held)
    pending: list[Callable[[], None]] = []
    sent: list[dict[str, float]] = []
    tally = FallbackTally(sent.append, lambda name: name, pending.append)

    # When three fallbacks are counted before the first send runs
    for _ in range(3):
        tally.count("dep", "breaker_open")
    tally.count("dep", "bulkhead_full")

    # Then one send is under way, and it carries all of them
    assert len(pending) == 1
    pending.pop()()
    assert sent == [{"fallbacks|dep|breaker_open": 3.0, "fallbacks|dep|bulkhead_full": 1.0}]
    assert pending == []
    # And a count after it starts the next send
    tally.count("dep", "breaker_open")
    pending.pop()()
    assert sent[-1] == {"fallbacks|dep|breaker_open": 1.0}


def test_a_send_that_fails_loses_only_its_counts_and_never_reaches_the_caller() -> None:
    pending: list[Callable[[], None]] = []

    def down(counts: dict[str, float]) -> None:
        raise ConnectionError("Redis away")

    tally = FallbackTally(down, lambda name: name, pending.append)
    tally.count("dep", "unavailable")
    pending.pop()()  # raises nothing
    tally.count("dep", "unavailable")
    assert len(pending) == 1  # the next count sends again


def test_a_forked_child_counts_a_fallback_though_a_parent_thread_held_the_tally_at_the_fork() -> (
    None
):
    # Given a tally whose lock a thread of the parent holds (as a counting thread does for an
    # instant) when the process forks
    pending: list[Callable[[], None]] = []
    tally = FallbackTally(lambda counts: None, lambda name: name, pending.append)
    held, release = threading.Event(), threading.Event()

    def counting() -> None:
        with tally._lock:
            held.set()
            release.wait()

    thread = threading.Thread(target=counting)
    thread.start()
    try:
        assert held.wait(30)

        # When the child counts a fallback
        def child() -> dict[str, Any]:
            tally.count("dep", "breaker_open")
            return {"sends": len(pending)}

        report = run_in_child(child, 10.0)
    finally:
        release.set()
        thread.join()
    # Then it counts, and sends, without the parent's thread
    assert report == {"sends": 1}
