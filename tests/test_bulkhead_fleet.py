"""The bulkhead shared by a fleet of real processes, through real Redis.

Each process is a separate interpreter (multiprocessing "spawn") with its own connections and its
own ``Breaker``, as prefork children on several hosts would be. The dependency counts the calls
in flight itself (a Redis counter it increments on arrival and decrements on leaving), so the
limit is measured where it matters, not from the breaker's own bookkeeping.
"""

from __future__ import annotations

import os
import signal
import time
from multiprocessing.process import BaseProcess
from typing import Any, cast

import pytest
import redis

from celery_resilience import BulkheadFull

from .support.fleet import (
    BARRIER_TIMEOUT,
    JOIN_TIMEOUT,
    SPAWN,
    fleet_resilience,
    join_all,
    redis_time_us,
    start,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LIMIT = 2
FLEET_OPTIONS = {"failure_threshold": 1000, "max_concurrent_calls": LIMIT, "call_lease": 30.0}
CALLS_EACH = 25


def dependency(client: redis.Redis, prefix: str) -> None:
    """A call that takes a while; logs how many calls were in flight when it arrived."""
    inflight = client.incr(f"{prefix}:dep:inflight")
    client.rpush(f"{prefix}:dep:seen", inflight)
    time.sleep(0.02)
    client.decr(f"{prefix}:dep:inflight")


def caller(redis_url: str, prefix: str, barrier: Any) -> None:  # pragma: no cover - spawned
    resilience = fleet_resilience(redis_url, prefix, FLEET_OPTIONS)
    breaker = resilience.breaker("dep")
    client = redis.Redis.from_url(redis_url)
    barrier.wait(BARRIER_TIMEOUT)
    ran = full = 0
    for _ in range(CALLS_EACH):
        try:
            breaker.call(dependency, client, prefix)
            ran += 1
        except BulkheadFull:
            full += 1
            time.sleep(0.005)
    client.rpush(f"{prefix}:outcomes", f"{os.getpid()} {ran} {full}")


def test_a_fleet_of_processes_never_has_more_than_the_limit_in_flight(
    redis_url: str,
    redis_client: redis.Redis,
    key_prefix: str,
    started: list[BaseProcess],
) -> None:
    processes = 6
    barrier = SPAWN.Barrier(processes)
    fleet = [start(started, caller, redis_url, key_prefix, barrier) for _ in range(processes)]
    join_all(fleet)

    seen = [int(v) for v in redis_client.lrange(f"{key_prefix}:dep:seen", 0, -1)]
    outcomes = [
        line.decode().split()
        for line in cast(list[bytes], redis_client.lrange(f"{key_prefix}:outcomes", 0, -1))
    ]
    ran = sum(int(o[1]) for o in outcomes)
    full = sum(int(o[2]) for o in outcomes)
    print(f"calls {ran}, turned away {full}, peak in flight {max(seen)}")
    assert len(outcomes) == processes
    assert ran == len(seen)
    assert ran + full == processes * CALLS_EACH
    assert max(seen) <= LIMIT, f"{max(seen)} calls in flight at once"
    assert max(seen) == LIMIT
    assert full > 0
    snap = fleet_resilience(redis_url, key_prefix, FLEET_OPTIONS).breaker("dep").snapshot()
    assert (snap["calls_in_flight"], snap["bulkhead_rejected_total"]) == (0, full)


# Seconds of lease: the test must see the dead holder's slot held after the kill and join.
LEASE_OPTIONS = {"max_concurrent_calls": 1, "call_lease": 3.0}


def slot_holder(redis_url: str, prefix: str) -> None:  # pragma: no cover - spawned process
    """Take the only slot, say so, and hang without ever reporting an outcome."""
    resilience = fleet_resilience(redis_url, prefix, LEASE_OPTIONS)
    permit = resilience.breaker("dep").acquire()
    resilience.runtime.redis.rpush(f"{prefix}:holder", f"{os.getpid()} {permit.permit_id}")
    while True:
        time.sleep(60)


def test_the_slot_of_a_killed_process_comes_back_when_its_lease_ends(
    redis_url: str,
    redis_client: redis.Redis,
    key_prefix: str,
    started: list[BaseProcess],
) -> None:
    resilience = fleet_resilience(redis_url, key_prefix, LEASE_OPTIONS)
    breaker = resilience.breaker("dep")

    # given: another process took the only slot, then died by SIGKILL without reporting
    holder = start(started, slot_holder, redis_url, key_prefix)
    popped = redis_client.blpop([f"{key_prefix}:holder"], timeout=JOIN_TIMEOUT)
    assert popped is not None, "the slot holder never acquired"
    pid, permit_id = cast(bytes, popped[1]).decode().split()
    assert int(pid) == holder.pid
    calls_key = resilience.runtime.breaker_store.keys("dep")[2]  # type: ignore[attr-defined]
    lease_end_us = int(cast(float, redis_client.zscore(calls_key, permit_id)))
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(JOIN_TIMEOUT)
    assert holder.exitcode == -signal.SIGKILL

    # when / then: the limit holds while the dead holder's lease runs...
    assert breaker.snapshot()["calls_in_flight"] == 1
    rejections = 0
    deadline = time.monotonic() + LEASE_OPTIONS["call_lease"] + 5.0
    while True:
        assert time.monotonic() < deadline, "the dead holder's lease never ended"
        before = redis_time_us(redis_client)
        try:
            permit = breaker.acquire()
        except BulkheadFull:
            assert before < lease_end_us, "turned away after the dead holder's lease ended"
            rejections += 1
            time.sleep(0.01)
            continue
        after = redis_time_us(redis_client)
        break
    assert rejections >= 1, "the killed holder's slot was not held at all"
    # ...and once it ends, the next caller gets the slot, well within a margin
    assert after >= lease_end_us
    assert before <= lease_end_us + 1_000_000
    permit.success()
    assert breaker.snapshot()["calls_in_flight"] == 0
