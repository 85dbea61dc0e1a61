"""``Resilience(app).breaker(name)`` on the real Redis: calls, permits, deferred successes,
operator orders, transition events, threads, fork, and time taken from Redis ``TIME``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from celery_resilience import BreakerOpen, Resilience
from celery_resilience.breaker import Breaker
from celery_resilience.breaker.breaker import FLUSH_INTERVAL
from celery_resilience.breaker.permit import Permit
from tests.support.forking import run_in_child
from tests.support.resilience import MakeResilience
from tests.support.round_trips import RoundTrips, known

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
HOURS = 3600.0


class Boom(Exception):
    pass


class NotFound(Exception):
    """A business error: the dependency answered, so the breaker should not count it."""


def boom() -> None:
    raise Boom("dependency down")


def not_found() -> None:
    raise NotFound("no such order")


def dep(**options: Any) -> dict[str, Any]:
    """The breakers of these tests: ``dep``, with ``options``."""
    return {"dep": {"failure_threshold": 3, "open_timeout": 30.0, **options}}


@pytest.fixture
def make_breaker(make_resilience: MakeResilience) -> Callable[..., Breaker]:
    return lambda **options: make_resilience(breakers=dep(**options)).breaker("dep")


def fail(breaker: Breaker, times: int = 1) -> None:
    for _ in range(times):
        with pytest.raises(Boom):
            breaker.call(boom)


def redis_now(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return seconds + micros / 1e6


# -- call() ------------------------------------------------------------------------------
def test_call_returns_the_functions_result_and_passes_arguments(
    make_breaker: Callable[..., Breaker],
) -> None:
    breaker = make_breaker()
    assert breaker.call(lambda a, b=0: a + b, 2, b=3) == 5


def test_a_failing_call_propagates_and_is_counted(make_breaker: Callable[..., Breaker]) -> None:
    breaker = make_breaker()
    fail(breaker, 2)
    snap = breaker.snapshot()
    assert snap["state"] == "closed"
    assert (snap["consecutive_failures"], snap["window_failures"]) == (2, 2)


def test_after_failure_threshold_failures_call_raises_breaker_open_without_calling(
    make_breaker: Callable[..., Breaker],
) -> None:
    breaker = make_breaker(failure_threshold=3, open_timeout=30.0)
    fail(breaker, 3)
    calls: list[int] = []
    with pytest.raises(BreakerOpen) as info:
        breaker.call(calls.append, 1)
    assert calls == []
    assert (info.value.breaker, info.value.state) == ("dep", "open")
    assert info.value.retry_after is not None
    assert 29.0 < info.value.retry_after <= 30.0


def test_an_ignored_exception_propagates_but_is_not_counted(
    make_breaker: Callable[..., Breaker],
) -> None:
    breaker = make_breaker(failure_threshold=3, ignore=[NotFound])
    fail(breaker, 2)
    for _ in range(3):
        with pytest.raises(NotFound):
            breaker.call(not_found)
    breaker.flush()
    snap = breaker.snapshot()
    # Neither a failure (it would have tripped) nor a success (it would reset the count).
    assert (snap["state"], snap["consecutive_failures"], snap["window_calls"]) == ("closed", 2, 2)
    fail(breaker)
    assert breaker.state == "open"


def test_an_ignored_exception_ends_a_half_open_probe(make_breaker: Callable[..., Breaker]) -> None:
    breaker = make_breaker(failure_threshold=1, open_timeout=0.2, ignore=[NotFound])
    fail(breaker)
    time.sleep(0.25)
    with pytest.raises(NotFound):
        breaker.call(not_found)
    # The probe did not stay leased (which would hold half-open for probe_lease).
    assert breaker.snapshot()["probes_in_flight"] == 0
    assert breaker.call(lambda: "ok") == "ok"


def test_a_slow_success_counts_as_a_failure(make_breaker: Callable[..., Breaker]) -> None:
    breaker = make_breaker(failure_threshold=2, slow_call_seconds=0.05)
    assert breaker.call(time.sleep, 0.08) is None  # the caller still gets its result
    assert breaker.snapshot()["consecutive_failures"] == 1
    breaker.call(time.sleep, 0.08)
    assert breaker.state == "open"


def test_a_fast_success_under_slow_call_seconds_is_a_success(
    make_breaker: Callable[..., Breaker],
) -> None:
    breaker = make_breaker(failure_threshold=2, slow_call_seconds=5.0)
    fail(breaker)
    breaker.call(lambda: None)
    breaker.flush()
    assert breaker.snapshot()["consecutive_failures"] == 0


# -- acquire() and Permit ------------------------------------------------------------------
def test_a_permit_reports_success_and_failure(make_breaker: Callable[..., Breaker]) -> None:
    breaker = make_breaker()
    breaker.acquire().failure()
    breaker.acquire().failure()
    assert breaker.snapshot()["consecutive_failures"] == 2
    breaker.acquire().success()
    breaker.flush()
    assert breaker.snapshot()["consecutive_failures"] == 0


def test_a_permit_as_context_manager_records_an_exception_as_failure(
    make_breaker: Callable[..., Breaker],
) -> None:
    breaker = make_breaker()
    with pytest.raises(Boom), breaker.acquire():
        boom()
    with breaker.acquire() as permit:
        assert permit.kind == "normal"
    breaker.flush()
    snap = breaker.snapshot()
    assert (snap["window_calls"], snap["window_failures"]) == (2, 1)


def test_reporting_a_permit_twice_is_a_no_op(make_breaker: Callable[..., Breaker]) -> None:
    breaker = make_breaker()
    permit = breaker.acquire()
    permit.failure()
    permit.failure()
    permit.success()
    other = breaker.acquire()
    other.success()
    other.failure()
    breaker.flush()
    snap = breaker.snapshot()
    assert (snap["window_calls"], snap["window_failures"]) == (2, 1)
    assert snap["consecutive_failures"] == 0


def test_acquire_on_an_open_breaker_raises_breaker_open(
    make_breaker: Callable[..., Breaker],
) -> None:
    breaker = make_breaker(failure_threshold=1)
    breaker.acquire().failure()
    with pytest.raises(BreakerOpen, match="'dep' is open"):
        breaker.acquire()


# -- deferred successes ----------------------------------------------------------------------
def succeed(breaker: Breaker, times: int) -> None:
    for _ in range(times):
        breaker.call(lambda: None)


def defer_successes(breaker: Breaker, times: int) -> None:
    """``times`` successes, all held back in the process."""
    for permit in [known(breaker).acquire() for _ in range(times)]:
        permit.success()


def flush_interval_passes(breaker: Breaker) -> None:
    breaker._last_flush -= FLUSH_INTERVAL


def test_successes_are_held_back_and_sent_once_the_interval_passed(
    make_breaker: Callable[..., Breaker],
) -> None:
    breaker = make_breaker()
    defer_successes(breaker, 3)
    assert breaker.snapshot()["window_calls"] == 0  # held back
    succeed(breaker, 1)
    assert breaker.snapshot()["window_calls"] == 0  # within the interval: still held back
    flush_interval_passes(breaker)
    succeed(breaker, 1)  # sent now, with the four before it
    snap = breaker.snapshot()
    assert (snap["window_calls"], snap["successes_total"]) == (5, 5)


def test_a_success_after_a_failure_is_sent_at_once_and_ends_the_streak(
    make_breaker: Callable[..., Breaker],
) -> None:
    breaker = known(make_breaker())
    fail(breaker, 2)
    succeed(breaker, 1)  # ends a streak: recorded at once
    snap = breaker.snapshot()
    assert (snap["window_calls"], snap["consecutive_failures"]) == (3, 0)
    succeed(breaker, 2)  # no streak any more: held back again
    assert breaker.snapshot()["window_calls"] == 3


def test_held_back_successes_ride_with_the_next_failure_and_end_no_streak(
    make_breaker: Callable[..., Breaker],
) -> None:
    breaker = make_breaker()
    defer_successes(breaker, 3)
    assert breaker.snapshot()["window_calls"] == 0
    fail(breaker)
    snap = breaker.snapshot()
    assert (snap["window_calls"], snap["window_failures"], snap["consecutive_failures"]) == (
        4,
        1,
        1,
    )


def test_flush_sends_held_back_successes(make_breaker: Callable[..., Breaker]) -> None:
    breaker = make_breaker()
    defer_successes(breaker, 3)
    assert breaker.snapshot()["window_calls"] == 0
    breaker.flush()
    snap = breaker.snapshot()
    assert (snap["window_calls"], snap["successes_total"]) == (3, 3)
    breaker.flush()  # nothing left to send
    assert breaker.snapshot()["window_calls"] == 3


@pytest.mark.parametrize("threshold", [5])
def test_failures_apart_never_open_the_breaker_and_in_a_row_they_do(
    make_breaker: Callable[..., Breaker], threshold: int
) -> None:
    breaker = known(make_breaker(failure_threshold=threshold))
    for _ in range(threshold - 1):  # F S F S F S F S F
        fail(breaker)
        succeed(breaker, 1)
    fail(breaker)
    assert breaker.state == "closed"
    assert breaker.snapshot()["consecutive_failures"] == 1
    fail(breaker, threshold - 1)  # five in a row
    assert breaker.state == "open"  # type: ignore[comparison-overlap]  # it changed


def test_failures_apart_across_processes_never_open_the_breaker(
    make_resilience: MakeResilience,
) -> None:
    """F in one process, S in another, in turn: the second process hears of the streak and
    sends its success at once (it ends the streak) instead of holding it back."""
    failing = known(make_resilience(breakers=dep(failure_threshold=5)).breaker("dep"))
    passing = known(make_resilience(breakers=dep(failure_threshold=5)).breaker("dep"))
    for _ in range(4):
        fail(failing)
        deadline = time.monotonic() + 2.0
        while not passing._knowledge.admits("dep").streak:  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the streak was never heard of"
            time.sleep(0.001)
        succeed(passing, 1)
    fail(failing)
    assert failing.state == "closed"
    fail(failing, 4)
    assert failing.state == "open"  # type: ignore[comparison-overlap]  # it changed


def test_a_closed_breaker_admits_without_a_round_trip(
    make_breaker: Callable[..., Breaker], redis_client: redis.Redis
) -> None:
    breaker = known(make_breaker())
    round_trips = RoundTrips(breaker)
    began = time.monotonic()
    succeed(breaker, 200)
    elapsed = time.monotonic() - began
    # Not one command per call: held-back successes flushed at most once per FLUSH_INTERVAL.
    assert round_trips.count <= 1 + int(elapsed / FLUSH_INTERVAL), (round_trips.count, elapsed)


def test_a_process_hears_at_once_that_another_opened_the_breaker(
    make_resilience: MakeResilience,
) -> None:
    watcher = known(make_resilience(breakers=dep(failure_threshold=1)).breaker("dep"))
    tripper = make_resilience(breakers=dep(failure_threshold=1)).breaker("dep")
    fail(tripper)
    deadline = time.monotonic() + 1.0
    while watcher._knowledge.admits("dep") is not None:  # it stops admitting on its own
        assert time.monotonic() < deadline, "the opening was never heard of"
        time.sleep(0.0005)
    with pytest.raises(BreakerOpen):
        watcher.acquire()


def test_a_process_whose_watch_is_cut_asks_redis_again(
    make_breaker: Callable[..., Breaker], redis_client: redis.Redis, key_prefix: str
) -> None:
    breaker = known(make_breaker())
    # Only this test's subscriber: the Redis is shared, other runs' change feeds must stay up.
    assert kill_own_clients(redis_client, key_prefix, "pubsub") == 1
    deadline = time.monotonic() + 2.0
    while breaker._knowledge.admits("dep") is not None:  # what it knew is no longer trusted
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert breaker.call(lambda: "asked Redis") == "asked Redis"
    known(breaker)  # subscribed again: local once more


def kill_own_clients(client: redis.Redis, name: str, kind: str) -> int:
    """``CLIENT KILL ID`` each connection of ``kind`` (``pubsub``, ``normal``) named ``name``;
    how many were killed."""
    own = [c["id"] for c in client.client_list(_type=kind) if c["name"] == name]
    for client_id in own:
        client.client_kill_filter(_id=client_id)
    return len(own)


# -- state, snapshot, operator orders --------------------------------------------------------
def test_a_new_breaker_is_closed_with_the_contracts_snapshot_keys(
    make_breaker: Callable[..., Breaker],
) -> None:
    breaker = make_breaker()
    assert breaker.state == "closed"
    snap = breaker.snapshot()
    assert {
        "state",
        "consecutive_failures",
        "window_calls",
        "window_failures",
        "opened_at",
        "open_until",
        "opened_total",
    } <= set(snap)
    assert (snap["opened_at"], snap["open_until"], snap["opened_total"]) == (None, None, 0)


def test_the_snapshot_of_an_open_breaker_has_epoch_seconds(
    make_breaker: Callable[..., Breaker], redis_client: redis.Redis
) -> None:
    breaker = make_breaker(failure_threshold=1, open_timeout=30.0)
    fail(breaker)
    snap = breaker.snapshot()
    assert snap["state"] == "open"
    assert snap["opened_at"] == pytest.approx(redis_now(redis_client), abs=2.0)
    assert snap["open_until"] - snap["opened_at"] == pytest.approx(30.0)
    assert snap["opened_total"] == 1


def test_force_open_rejects_every_call_until_reset(make_breaker: Callable[..., Breaker]) -> None:
    breaker = make_breaker(open_timeout=0.1)
    breaker.force_open()
    assert breaker.state == "forced_open"
    time.sleep(0.15)
    with pytest.raises(BreakerOpen) as info:
        breaker.call(lambda: None)
    assert (info.value.state, info.value.retry_after) == ("forced_open", None)
    breaker.reset()
    assert breaker.state == "closed"  # type: ignore[comparison-overlap]  # it changed
    assert breaker.call(lambda: "ok") == "ok"


def test_force_closed_admits_every_call_and_failures_do_not_trip(
    make_breaker: Callable[..., Breaker],
) -> None:
    breaker = make_breaker(failure_threshold=2)
    breaker.force_closed()
    fail(breaker, 5)
    assert breaker.state == "forced_closed"
    assert breaker.call(lambda: "ok") == "ok"


def test_force_closed_ends_force_open(make_breaker: Callable[..., Breaker]) -> None:
    breaker = make_breaker()
    breaker.force_open()
    breaker.force_closed()
    assert breaker.call(lambda: "ok") == "ok"


def test_reset_closes_an_open_breaker_and_keeps_the_totals(
    make_breaker: Callable[..., Breaker],
) -> None:
    breaker = make_breaker(failure_threshold=1)
    fail(breaker)
    breaker.reset()
    snap = breaker.snapshot()
    assert (snap["state"], snap["consecutive_failures"], snap["opened_at"]) == ("closed", 0, None)
    assert snap["opened_total"] == 1


def test_every_worker_sees_the_same_breaker(make_resilience: MakeResilience) -> None:
    first = make_resilience(breakers=dep(failure_threshold=2)).breaker("dep")
    second = make_resilience(breakers=dep(failure_threshold=2)).breaker("dep")
    fail(first)
    fail(second)
    assert first.state == second.state == "open"
    with pytest.raises(BreakerOpen):
        second.call(lambda: None)


def test_after_open_timeout_a_probe_success_closes_the_breaker(
    make_breaker: Callable[..., Breaker],
) -> None:
    breaker = make_breaker(failure_threshold=1, open_timeout=0.2)
    fail(breaker)
    time.sleep(0.25)
    assert breaker.state == "half_open"
    assert breaker.call(lambda: "probe") == "probe"
    assert breaker.state == "closed"  # type: ignore[comparison-overlap]  # it changed


def test_half_open_admits_one_probe_at_a_time(make_breaker: Callable[..., Breaker]) -> None:
    breaker = make_breaker(failure_threshold=1, open_timeout=0.2, half_open_max_calls=1)
    fail(breaker)
    time.sleep(0.25)
    probe = breaker.acquire()
    assert probe.kind == "probe"
    with pytest.raises(BreakerOpen) as info:
        breaker.acquire()
    assert info.value.state == "half_open"
    probe.failure()
    assert breaker.state == "open"


@pytest.mark.parametrize("kind", ["redis", "memory"])
def test_the_failure_of_a_permit_whose_holder_died_is_a_failed_probe_or_a_failed_call(
    make_resilience: MakeResilience, kind: str
) -> None:
    """A time limit's kill records the call of a permit it no longer has: ``"lost"``."""
    resilience = make_resilience(kind, breakers=dep(failure_threshold=2, open_timeout=0.2))
    breaker = resilience.breaker("dep")
    Permit(breaker, "lost", "a-call-of-a-dead-child").failure()  # closed: a failed call
    assert breaker.snapshot()["consecutive_failures"] == 1
    fail(breaker)
    time.sleep(0.25)
    probe = breaker.acquire()
    assert probe.kind == "probe"
    Permit(breaker, "lost", probe.permit_id).failure()  # a failed probe: open again, at once
    assert breaker.state == "open"
    assert breaker.snapshot()["opened_total"] == 2


# -- transition events -----------------------------------------------------------------------
Event = tuple[str, str, str]


def listen(resilience: Resilience) -> list[Event]:
    events: list[Event] = []
    resilience.runtime.transition_listeners.append(lambda *event: events.append(event))
    return events


def test_listeners_hear_each_transition_exactly_once(make_resilience: MakeResilience) -> None:
    resilience = make_resilience(breakers=dep(failure_threshold=2, open_timeout=0.2))
    events = listen(resilience)
    breaker = resilience.breaker("dep")
    fail(breaker, 2)
    with pytest.raises(BreakerOpen):
        breaker.call(lambda: None)
    time.sleep(0.25)
    breaker.call(lambda: None)
    breaker.force_open()
    breaker.force_open()
    breaker.force_closed()
    breaker.reset()
    assert [e[1:] for e in events] == [
        ("opened", "open"),
        ("half_opened", "half_open"),
        ("closed", "closed"),
        ("forced_open", "forced_open"),
        ("forced_closed", "forced_closed"),
        ("reset", "closed"),
    ]
    assert {e[0] for e in events} == {"dep"}


def test_only_the_worker_that_made_a_transition_hears_it(make_resilience: MakeResilience) -> None:
    tripper, bystander = (
        make_resilience(breakers=dep(failure_threshold=1)),
        make_resilience(breakers=dep(failure_threshold=1)),
    )
    tripper_events, bystander_events = listen(tripper), listen(bystander)
    fail(tripper.breaker("dep"))
    with pytest.raises(BreakerOpen):
        bystander.breaker("dep").call(lambda: None)
    assert [e[1] for e in tripper_events] == ["opened"]
    assert bystander_events == []


def test_a_failing_listener_does_not_break_the_call(
    make_resilience: MakeResilience, caplog: pytest.LogCaptureFixture
) -> None:
    resilience = make_resilience(breakers=dep(failure_threshold=1))

    def broken(*event: object) -> None:
        raise RuntimeError("listener bug")

    resilience.runtime.transition_listeners.append(broken)
    events = listen(resilience)
    fail(resilience.breaker("dep"))
    assert [e[1] for e in events] == ["opened"]
    assert "listener" in caplog.text


def test_exactly_one_of_many_threads_sees_the_breaker_open(make_resilience: MakeResilience) -> None:
    threads, failures_each = 8, 4
    workers = [make_resilience(breakers=dep(failure_threshold=3)) for _ in range(threads)]
    heard = [listen(worker) for worker in workers]
    start = threading.Barrier(threads)
    errors: list[BaseException] = []

    def hammer(worker: Resilience) -> None:
        try:
            breaker = worker.breaker("dep")
            permits = [breaker.acquire() for _ in range(failures_each)]  # all while closed
            start.wait(timeout=10)
            for permit in permits:
                permit.failure()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    pool = [threading.Thread(target=hammer, args=(w,)) for w in workers]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=30)
    assert errors == []
    opened = [e for events in heard for e in events if e[1] == "opened"]
    assert len(opened) == 1
    snap = workers[0].breaker("dep").snapshot()
    assert (snap["state"], snap["opened_total"]) == ("open", 1)
    assert snap["failures_total"] == threads * failures_each


# -- fork ---------------------------------------------------------------------------------------
def test_a_forked_child_uses_its_own_connection(make_resilience: MakeResilience) -> None:
    resilience = make_resilience(breakers=dep(failure_threshold=5))
    breaker = resilience.breaker("dep")
    parent_client = resilience.runtime.redis
    parent_connection = parent_client.client_id()
    fail(breaker)

    def child() -> dict[str, Any]:
        client = resilience.runtime.redis
        with pytest.raises(Boom):
            breaker.call(boom)
        return {
            "new_client": client is not parent_client,
            "same_after": resilience.runtime.redis is client,
            "connection": client.client_id(),
            "consecutive": breaker.snapshot()["consecutive_failures"],
        }

    report = run_in_child(child)
    assert report.get("error") is None, report
    assert report["new_client"]
    assert report["same_after"]
    assert report["connection"] != parent_connection
    assert report["consecutive"] == 2  # the child shares the parent's breaker
    assert resilience.runtime.redis is parent_client  # the parent keeps its own
    assert breaker.snapshot()["consecutive_failures"] == 2


def test_a_forked_child_is_not_stuck_on_a_lock_its_parents_watch_held(
    make_resilience: MakeResilience,
) -> None:
    """The watch thread takes the knowledge's lock for each change it hears; a fork copies the
    lock as that thread left it, and the child has no such thread to release it."""
    resilience = make_resilience(breakers=dep())
    breaker = resilience.breaker("dep")
    breaker.call(lambda: None)  # the watch runs
    knowledge = resilience.runtime.knowledge
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # where the watch thread is while it hears a change
        with knowledge._lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        report = run_in_child(lambda: {"result": breaker.call(lambda: 7)}, timeout=10)
    finally:
        release.set()
        holder.join()
    assert report == {"result": 7}
    assert breaker.call(lambda: 8) == 8  # and the parent's lock is its own still


def test_a_forked_child_does_not_report_its_parents_deferred_successes(
    make_resilience: MakeResilience,
) -> None:
    breaker = make_resilience(breakers=dep()).breaker("dep")
    breaker.acquire().failure()
    defer_successes(breaker, 2)  # held back in the parent

    def child() -> dict[str, Any]:
        breaker.flush()
        return {}

    assert run_in_child(child) == {}
    breaker.flush()
    assert breaker.snapshot()["window_calls"] == 3


# -- time comes from Redis ----------------------------------------------------------------------
class ShiftedClock:
    """Moves this process's ``time.time`` / ``time.time_ns`` by ``offset`` seconds."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.offset = 0.0
        real_time, real_time_ns = time.time, time.time_ns
        monkeypatch.setattr(time, "time", lambda: real_time() + self.offset)
        monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() + int(self.offset * 1e9))


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> ShiftedClock:
    return ShiftedClock(monkeypatch)


@pytest.mark.parametrize("offset", [3 * HOURS, -3 * HOURS])
def test_opened_at_is_redis_time_not_the_process_clock(
    make_breaker: Callable[..., Breaker],
    redis_client: redis.Redis,
    clock: ShiftedClock,
    offset: float,
) -> None:
    clock.offset = offset
    breaker = make_breaker(failure_threshold=1, open_timeout=0.5)
    fail(breaker)
    snap = breaker.snapshot()
    assert abs(time.time() - redis_now(redis_client)) > HOURS  # the shift took effect
    assert snap["opened_at"] == pytest.approx(redis_now(redis_client), abs=2.0)
    assert snap["open_until"] - snap["opened_at"] == pytest.approx(0.5)


def test_the_process_clock_jumping_ahead_does_not_end_the_open_timeout(
    make_breaker: Callable[..., Breaker], clock: ShiftedClock
) -> None:
    breaker = make_breaker(failure_threshold=1, open_timeout=0.5)
    fail(breaker)
    clock.offset = 3 * HOURS
    with pytest.raises(BreakerOpen) as info:
        breaker.call(lambda: None)
    assert info.value.retry_after is not None
    assert 0 < info.value.retry_after <= 0.5
    assert breaker.state == "open"


def test_the_process_clock_jumping_back_does_not_keep_the_breaker_open(
    make_breaker: Callable[..., Breaker], clock: ShiftedClock
) -> None:
    clock.offset = 3 * HOURS
    breaker = make_breaker(failure_threshold=1, open_timeout=0.3)
    fail(breaker)
    clock.offset = -3 * HOURS
    time.sleep(0.35)
    assert breaker.state == "half_open"
    assert breaker.call(lambda: "probe") == "probe"
    assert breaker.state == "closed"  # type: ignore[comparison-overlap]  # it changed


CHILD = """
import json, sys, time
from celery import Celery
from celery_resilience import BreakerOpen, Resilience

url, prefix, action, open_timeout = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
app = Celery("t", broker=url, set_as_current=False)
app.conf.resilience_key_prefix = prefix
app.conf.resilience_redis_url = url
app.conf.resilience_breakers = {"dep": {"failure_threshold": 1, "open_timeout": open_timeout}}
breaker = Resilience(app).breaker("dep")
report = {"clock": time.time()}
if action == "trip":
    try:
        breaker.call(lambda: 1 / 0)
    except ZeroDivisionError:
        pass
    snap = breaker.snapshot()
    report["snapshot"] = {k: snap[k] for k in ("state", "opened_at", "open_until")}
else:
    try:
        with breaker.acquire() as permit:
            report["admitted"] = permit.kind
    except BreakerOpen as exc:
        report["rejected"] = [exc.state, exc.retry_after]
print(json.dumps(report))
"""

SITECUSTOMIZE = """
import os, time
_shift = float(os.environ["TEST_CLOCK_SHIFT"])
_time, _time_ns = time.time, time.time_ns
time.time = lambda: _time() + _shift
time.time_ns = lambda: _time_ns() + int(_shift * 1e9)
"""


def run_shifted(
    shift_hours: int, tmp_path: Path, redis_url: str, prefix: str, action: str, timeout: float
) -> dict[str, Any]:
    """Run ``CHILD`` in a subprocess whose clock is ``shift_hours`` off.

    libfaketime (``faketime``) shifts every clock call of the real process; without it, a
    ``sitecustomize`` shifts Python's ``time.time`` / ``time.time_ns``.
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-c", CHILD, redis_url, prefix, action, str(timeout)]
    faketime = shutil.which("faketime")
    if faketime:
        command = [faketime, "-f", f"{shift_hours:+d}h", *command]
    else:
        (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
        env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{ROOT}"
        env["TEST_CLOCK_SHIFT"] = str(shift_hours * HOURS)
    done = subprocess.run(
        command, check=False, env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    return cast(dict[str, Any], json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("shift_hours", [3, -3])
def test_a_worker_with_a_skewed_clock_opens_the_breaker_at_redis_time(
    make_breaker: Callable[..., Breaker],
    redis_client: redis.Redis,
    redis_url: str,
    key_prefix: str,
    tmp_path: Path,
    shift_hours: int,
) -> None:
    # Far below the clock's skew (hours), far above a child's start-up on a busy host.
    open_timeout = 600.0
    breaker = make_breaker(failure_threshold=1, open_timeout=open_timeout)
    report = run_shifted(shift_hours, tmp_path, redis_url, key_prefix, "trip", open_timeout)
    now = redis_now(redis_client)
    assert report["clock"] - now == pytest.approx(shift_hours * HOURS, abs=60)  # it was skewed
    snap = report["snapshot"]
    assert snap["state"] == "open"
    assert snap["opened_at"] == pytest.approx(now, abs=5.0)
    assert snap["open_until"] - snap["opened_at"] == pytest.approx(open_timeout)
    # This (unskewed) process agrees: still open, for at most open_timeout more.
    with pytest.raises(BreakerOpen) as info:
        breaker.call(lambda: None)
    assert info.value.retry_after is not None
    assert 0 < info.value.retry_after <= open_timeout


@pytest.mark.parametrize("shift_hours", [3, -3])
def test_a_worker_with_a_skewed_clock_sees_the_open_timeout_in_redis_time(
    make_breaker: Callable[..., Breaker],
    redis_client: redis.Redis,
    redis_url: str,
    key_prefix: str,
    tmp_path: Path,
    shift_hours: int,
) -> None:
    # Far below the clock's skew (hours), far above a child's start-up on a busy host.
    open_timeout = 600.0
    breaker = make_breaker(failure_threshold=1, open_timeout=open_timeout)
    fail(breaker)
    report = run_shifted(shift_hours, tmp_path, redis_url, key_prefix, "acquire", open_timeout)
    assert report["clock"] - redis_now(redis_client) == pytest.approx(shift_hours * HOURS, abs=60)
    assert "admitted" not in report, report
    state, retry_after = report["rejected"]
    assert state == "open"
    assert 0 < retry_after <= open_timeout
