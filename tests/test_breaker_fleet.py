"""One breaker shared by a fleet of real processes, through real Redis.

Every worker here is a separate interpreter (multiprocessing "spawn"), so each has its own Redis
connections and its own ``Breaker`` object, as prefork children on different hosts would. The
processes start together behind a barrier so that they really race on the Lua scripts.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from multiprocessing.process import BaseProcess
from typing import Any, cast

import pytest
import redis

from celery_resilience import BreakerOpen, Resilience
from celery_resilience.breaker import Breaker
from tests.support.fleet import (
    BARRIER_TIMEOUT,
    JOIN_TIMEOUT,
    SPAWN,
    fleet_resilience,
    join_all,
    redis_time_us,
    start,
)
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


class DependencyDown(ConnectionError):
    """What the always-failing dependency raises."""


# -- helpers shared by the parent and the spawned processes -----------------------------------
def watch(resilience: Resilience) -> Counter[str]:
    """Count the transitions that this process's own script calls made."""
    seen: Counter[str] = Counter()
    resilience.runtime.transition_listeners.append(
        lambda _name, transition, _state: seen.update([transition])
    )
    return seen


def trip(breaker: Breaker, failures: int) -> None:
    def down() -> None:
        raise DependencyDown("dependency down")

    for _ in range(failures):
        with pytest.raises(DependencyDown):
            breaker.call(down)
    snap = breaker.snapshot()
    # An open breaker whose short open_timeout has already run reads as half_open: a loaded
    # host may take that long between the last failure and this read.
    assert snap["opened_total"] == 1
    assert snap["state"] in ("open", "half_open")


def wait_for_half_open(breaker: Breaker) -> None:
    """An open breaker whose ``open_timeout`` has passed (Redis time) reads as ``half_open``."""
    wait_for(lambda: breaker.snapshot()["state"] == "half_open", "the breaker's open timeout")


# -- 1. a fleet hammering one failing dependency ----------------------------------------------
FLEET_OPTIONS = {
    "failure_threshold": 5,
    "open_timeout": 0.3,
    "half_open_max_calls": 1,
    # Longer than the run: no probe lease expires, so every half-open phase admits exactly
    # half_open_max_calls probes (lease expiry is test 2's subject).
    "probe_lease": 10.0,
}
FLEET_SECONDS = 3.0
REJECTED_PAUSE = 0.003


def fleet_worker(
    redis_url: str, prefix: str, barrier: Any, seconds: float, pause: float
) -> None:  # pragma: no cover - runs in a spawned process
    resilience = fleet_resilience(redis_url, prefix, FLEET_OPTIONS)
    breaker = resilience.breaker("dep")
    seen = watch(resilience)
    client = resilience.runtime.redis
    pid = os.getpid()

    def dependency() -> None:
        """Always down; leaves one line per call: pid and Redis TIME (µs)."""
        client.rpush(f"{prefix}:calls", f"{pid} {redis_time_us(client)}")
        raise DependencyDown("dependency down")

    breaker.snapshot()  # connect before the start line
    barrier.wait(BARRIER_TIMEOUT)
    failed = rejected = unavailable = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            breaker.call(dependency)
        except DependencyDown:
            failed += 1
        except BreakerOpen as exc:
            rejected += 1
            unavailable += exc.state == "unavailable"
            time.sleep(pause)
    report = {"pid": pid, "failed": failed, "rejected": rejected, "unavailable": unavailable}
    client.rpush(f"{prefix}:reports", json.dumps({**report, "seen": dict(seen)}))


@pytest.mark.parametrize("processes", [8, 16])
def test_fleet_makes_each_transition_once_and_bounds_dependency_calls(
    redis_url: str,
    redis_client: redis.Redis,
    key_prefix: str,
    started: list[BaseProcess],
    processes: int,
) -> None:
    # given: N processes, one always-failing dependency, released at once
    barrier = SPAWN.Barrier(processes + 1)
    workers = [
        start(started, fleet_worker, redis_url, key_prefix, barrier, FLEET_SECONDS, REJECTED_PAUSE)
        for _ in range(processes)
    ]
    # when: they all call it through the shared breaker for a few seconds
    barrier.wait(BARRIER_TIMEOUT)
    join_all(workers)

    # then
    reports = [json.loads(r) for r in redis_client.lrange(f"{key_prefix}:reports", 0, -1)]
    calls = [line.split() for line in redis_client.lrange(f"{key_prefix}:calls", 0, -1)]
    snap = fleet_resilience(redis_url, key_prefix, FLEET_OPTIONS).breaker("dep").snapshot()
    seen: Counter[str] = Counter()
    for report in reports:
        seen.update(report["seen"])
    threshold, probes = FLEET_OPTIONS["failure_threshold"], FLEET_OPTIONS["half_open_max_calls"]
    opened = snap["opened_total"]

    assert len(reports) == processes
    assert sum(r["unavailable"] for r in reports) == 0  # Redis answered every call
    # Exactly one process saw each transition: the one whose script call made it.
    assert seen["opened"] == opened
    assert seen["half_opened"] == snap["half_opened_total"]
    assert seen["closed"] == snap["closed_total"] == 0
    assert opened >= 3, f"only {opened} trips in {FLEET_SECONDS}s: the test proves little"
    # Every half-open phase let its probe through, the probe failed and reopened the breaker
    # (each process finishes its call before it stops).
    assert snap["half_opened_total"] == opened - 1
    # Every dependency call was recorded exactly once (late ones count but change no state).
    assert snap["failures_total"] == snap["calls_total"] == len(calls)
    assert sum(r["failed"] for r in reports) == len(calls)
    assert snap["successes_total"] == 0

    # The bound. The first trip happens on the record of the failure_threshold-th consecutive
    # failure; at that moment every other process holds at most one normal permit, so at most
    # processes - 1 more calls were in flight. The dependency never recovers, so the breaker
    # never closes again and no normal permit is granted after the first trip. Every later trip
    # is made by a failing probe, and each half-open phase (one per later trip, with no lease
    # expiring) admits at most half_open_max_calls probes. Hence
    #   calls <= failure_threshold + (processes - 1) + (opened_total - 1) * half_open_max_calls
    # which is tighter than opened_total * (threshold + processes - 1 + probes) + threshold.
    upper = threshold + (processes - 1) + (opened - 1) * probes
    lower = threshold + (opened - 1)  # the threshold's failures, then at least one probe each
    assert lower <= len(calls) <= upper, (len(calls), opened)

    # Time comes from Redis: trip k+1 needs a probe admitted open_timeout after trip k, so the
    # calls (stamped with Redis TIME) span at least (opened_total - 1) * open_timeout.
    stamps = sorted(int(stamp) for _pid, stamp in calls)
    open_timeout_us = round(FLEET_OPTIONS["open_timeout"] * 1_000_000)
    assert stamps[-1] - stamps[0] >= (opened - 1) * open_timeout_us
    assert len({pid for pid, _stamp in calls}) >= 2  # the calls really came from a fleet


# -- 2. a probe whose process is killed with -9 ----------------------------------------------
LEASE_OPTIONS = {
    "failure_threshold": 1,
    "open_timeout": 0.3,
    "half_open_max_calls": 1,
    # Seconds of lease: the test must see the dead probe held after the kill and join.
    "probe_lease": 3.0,
}


def probe_holder(redis_url: str, prefix: str) -> None:  # pragma: no cover - spawned process
    """Take the half-open probe, say so, and hang without ever recording an outcome."""
    resilience = fleet_resilience(redis_url, prefix, LEASE_OPTIONS)
    permit = resilience.breaker("dep").acquire()
    resilience.runtime.redis.rpush(
        f"{prefix}:holder", f"{os.getpid()} {permit.kind} {permit.permit_id}"
    )
    while True:
        time.sleep(60)


def test_probe_of_a_killed_process_is_released_when_its_lease_ends(
    redis_url: str,
    redis_client: redis.Redis,
    key_prefix: str,
    started: list[BaseProcess],
) -> None:
    resilience = fleet_resilience(redis_url, key_prefix, LEASE_OPTIONS)
    breaker = resilience.breaker("dep")
    seen = watch(resilience)
    trip(breaker, 1)
    wait_for_half_open(breaker)

    # given: another process took the only probe, then died by SIGKILL without recording
    holder = start(started, probe_holder, redis_url, key_prefix)
    popped = redis_client.blpop([f"{key_prefix}:holder"], timeout=JOIN_TIMEOUT)
    assert popped is not None, "the probe holder never acquired"
    pid, kind, permit_id = cast(bytes, popped[1]).decode().split()
    assert (int(pid), kind) == (holder.pid, "probe")
    probes_key = resilience.runtime.breaker_store.keys("dep")[1]  # type: ignore[attr-defined]
    lease_end_us = int(cast(float, redis_client.zscore(probes_key, permit_id)))
    os.kill(cast(int, holder.pid), signal.SIGKILL)
    holder.join(JOIN_TIMEOUT)
    assert holder.exitcode == -signal.SIGKILL

    # when / then: the fleet-wide limit holds while the dead probe's lease runs...
    assert breaker.snapshot()["probes_in_flight"] == 1
    rejections = 0
    margin_us = 1_000_000
    deadline = time.monotonic() + LEASE_OPTIONS["probe_lease"] + 2.0
    while True:
        assert time.monotonic() < deadline, "the dead probe's lease never ended"
        before = redis_time_us(redis_client)
        try:
            permit = breaker.acquire()
        except BreakerOpen as exc:
            rejected_in = exc.state
            assert before < lease_end_us, "rejected after the dead probe's lease ended"
            assert rejected_in == "half_open"
            rejections += 1
            time.sleep(0.01)
            continue
        after = redis_time_us(redis_client)
        break
    assert rejections >= 1, "the killed probe's lease was not held at all"

    # ...and once it ends, the next caller is admitted as the probe, well within the margin
    assert permit.kind == "probe"
    assert after >= lease_end_us
    assert before <= lease_end_us + margin_us

    # a successful probe closes the breaker: it was never stuck
    permit.success()
    snap = breaker.snapshot()
    assert snap["state"] == "closed"
    assert seen["closed"] == snap["closed_total"] == 1
    assert snap["half_opened_total"] == 1  # one half-open phase, its first probe re-leased


# -- 3. processes racing for half-open probes -------------------------------------------------
def probe_racer(
    redis_url: str, prefix: str, options: dict[str, Any], barrier: Any
) -> None:  # pragma: no cover - spawned process
    """Ask once for a permit at the start line; report; exit holding any probe (no record)."""
    resilience = fleet_resilience(redis_url, prefix, options)
    breaker = resilience.breaker("dep")
    seen = watch(resilience)
    breaker.snapshot()  # connect before the start line
    barrier.wait(BARRIER_TIMEOUT)
    try:
        outcome = str(breaker.acquire().kind)
    except BreakerOpen as exc:
        outcome = f"rejected:{exc.state}"
    report = {"pid": os.getpid(), "outcome": outcome, "seen": dict(seen)}
    resilience.runtime.redis.rpush(f"{prefix}:reports", json.dumps(report))


@pytest.mark.parametrize(("processes", "max_calls"), [(2, 1), (6, 3)])
def test_half_open_admits_at_most_max_calls_probes_across_the_fleet(
    redis_url: str,
    redis_client: redis.Redis,
    key_prefix: str,
    started: list[BaseProcess],
    processes: int,
    max_calls: int,
) -> None:
    options = {
        "failure_threshold": 1,
        "open_timeout": 0.3,
        "half_open_max_calls": max_calls,
        "probe_lease": 10.0,
    }
    barrier = SPAWN.Barrier(processes + 1)
    racers = [
        start(started, probe_racer, redis_url, key_prefix, options, barrier)
        for _ in range(processes)
    ]
    # given: a breaker past its open timeout, ready to half-open
    breaker = fleet_resilience(redis_url, key_prefix, options).breaker("dep")
    trip(breaker, 1)
    wait_for_half_open(breaker)

    # when: every process asks for a permit at once
    barrier.wait(BARRIER_TIMEOUT)
    join_all(racers)

    # then: exactly max_calls probes, fleet-wide; the others are rejected in half-open
    reports = [json.loads(r) for r in redis_client.lrange(f"{key_prefix}:reports", 0, -1)]
    outcomes = Counter(r["outcome"] for r in reports)
    assert outcomes == {"probe": max_calls, "rejected:half_open": processes - max_calls}
    seen: Counter[str] = Counter()
    for report in reports:
        seen.update(report["seen"])
    snap = breaker.snapshot()
    assert seen == {"half_opened": 1}  # one process made the transition, and only one
    assert snap["half_opened_total"] == 1
    assert snap["state"] == "half_open"
    assert snap["probes_in_flight"] == max_calls
    assert snap["rejected_total"] == processes - max_calls
