"""The bulkhead in a real prefork ``celery worker``: a hanging dependency holds at most N pool
slots, and every other delivery waits in the broker (sent again, its retries unchanged) without
calling it, whatever ``on_open`` says: a full bulkhead is a busy dependency, not a down one.

The worlds are those of ``tests/test_task_worker.py`` (``tests/apps/workerapp.py``); the dependency
counts the calls in flight itself (``<P>:dep:concurrency``: per call, the calls under way when it
arrived).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from .support.waiting import wait_for
from .support.worker_world import World

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LIMIT = 2
HANG = 5.0  # seconds each call to the hanging dependency takes


def peak_in_flight(world: World) -> int:
    seen = world.redis.lrange(f"{world.prefix}:dep:concurrency", 0, -1)
    return max((int(v) for v in seen), default=0)


def test_a_hanging_dependency_holds_at_most_n_pool_slots_and_the_rest_wait_in_the_broker(
    make_world: Callable[..., World],
) -> None:
    # given: a dependency that answers only after HANG seconds, a pool of 4, a bulkhead of 2,
    # on_open left at "park"
    world = make_world(max_concurrent_calls=LIMIT, failure_threshold=100, max_retries=1)
    world.dependency(up=True, latency=HANG)
    world.start_worker(pool="prefork", concurrency=4)

    # when: 8 deliveries arrive together
    ids = [world.publish("charge", f"order-{n}") for n in range(8)]

    # then: while the first 2 calls hang, the other 6 are turned away without calling it, and
    # neither parked nor charged an attempt: they wait in the broker
    wait_for(
        lambda: world.resilience.breaker("dep").snapshot()["bulkhead_rejected_total"] >= 6,
        "6 deliveries turned away",
        timeout=30.0,
    )
    # The second admitted call may reach the dependency a moment after the turn-aways counted.
    wait_for(lambda: world.dep_calls() >= LIMIT, "the admitted calls to reach it", timeout=30.0)
    first_call = min(record["time"] for record in world.dep_log())
    hanging = [r for r in world.dep_log() if r["time"] < first_call + HANG - 0.5]
    assert len(hanging) == LIMIT
    assert world.parked() == {}
    # and: every one succeeds in the end, never more than 2 at a time, each calling the
    # dependency once, on its first attempt (max_retries=1: a spent attempt would have parked)
    wait_for(lambda: world.succeeded() == set(ids), "all 8 to succeed", timeout=HANG * 8)
    log = world.dep_log()
    assert sorted(r["task_id"] for r in log) == sorted(ids)
    assert {r["retries"] for r in log} == {0}
    # The third call waited for a slot: it came once the first call's HANG was over (the second
    # admitted call may itself come late, so it is told apart by its rank, not its time).
    times = sorted(r["time"] for r in log)
    assert times[LIMIT] >= times[0] + HANG - 0.5
    assert peak_in_flight(world) == LIMIT
    assert world.parked() == {}
    # The last body recorded its success before it returned; its slot is freed as it returns.
    wait_for(
        lambda: world.resilience.breaker("dep").snapshot()["calls_in_flight"] == 0,
        "the last slot freed",
    )
    assert world.resilience.breaker("dep").state == "closed"
    world.assert_ledger()


def test_with_on_open_retry_a_full_bulkhead_spends_no_retry(
    make_world: Callable[..., World],
) -> None:
    # given: on_open="retry", a slow dependency, 4 pool processes sharing a bulkhead of 2
    world = make_world(
        max_concurrent_calls=LIMIT, on_open="retry", max_retries=1, failure_threshold=100
    )
    world.dependency(up=True, latency=1.0)
    world.start_worker(pool="prefork", concurrency=4)

    # when: 6 deliveries arrive together
    ids = [world.publish("charge", f"order-{n}") for n in range(6)]

    # then: every one succeeds in the end, never more than 2 at a time, and each called the
    # dependency exactly once, on its first attempt: turned-away deliveries were sent again
    # with their retries unchanged (with max_retries=1, spending them would have parked some)
    wait_for(lambda: world.succeeded() == set(ids), "all 6 to succeed", timeout=60.0)
    assert peak_in_flight(world) == LIMIT
    log = world.dep_log()
    assert sorted(r["task_id"] for r in log) == sorted(ids)
    assert {r["retries"] for r in log} == {0}
    assert world.parked() == {}
    snap = world.resilience.breaker("dep").snapshot()
    assert snap["bulkhead_rejected_total"] >= 4
    world.assert_ledger()
