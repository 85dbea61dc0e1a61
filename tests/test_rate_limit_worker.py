"""A breaker's ``rate_limit`` in a real ``celery worker``: a task over the rate waits in the broker
(sent again with a countdown, its retries unchanged) and runs once its slot comes; the
dependency is never called faster than the limit allows, and nothing is parked or lost.

The worlds are those of ``tests/test_task_worker.py`` (``tests/apps/workerapp.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from .support.waiting import wait_for
from .support.worker_world import World

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RATE = 4.0  # calls a second: batches of one call, a quarter of a second of the rate each
TASKS = 20  # at 4/s: 4 s or more of calls, which a per-process limit (8/s) would halve


def test_tasks_over_the_rate_wait_in_the_broker_with_no_retry_spent(
    make_world: Callable[..., World],
) -> None:
    # given: a dependency limited to 4 calls a second, tasks with no retry to spend
    # (max_retries=0: a spent attempt would have parked), a prefork pool of 2
    world = make_world(rate_limit=f"{RATE:g}/s", max_retries=0, failure_threshold=100)
    world.dependency(up=True)
    world.start_worker(pool="prefork", concurrency=2)

    # when: TASKS tasks arrive together
    ids = [world.publish("charge", f"order-{n}") for n in range(TASKS)]

    # then: each succeeds, calling the dependency once, on its first attempt
    wait_for(lambda: world.succeeded() == set(ids), f"all {TASKS} to succeed", timeout=120.0)
    log = world.dep_log()
    assert sorted(r["task_id"] for r in log) == sorted(ids)
    assert {r["retries"] for r in log} == {0}
    assert world.parked() == {}
    # and: those over the rate were turned away, never faster than the rate plus the bucket
    # and a batch held by each of the two processes
    snap = world.resilience.breaker("dep").snapshot()
    assert snap["rate_limited_total"] > 0
    times = sorted(r["time"] for r in log)
    # (the limit meters grants; a call comes a moment after its grant, longest for a pool
    # child's first task: a second of the rate covers that)
    assert len(times) <= RATE * (times[-1] - times[0] + 1.0) + 3
    world.assert_ledger()
