"""Retries never multiply a struggling dependency's load, in a real ``celery worker`` (solo):

- a brownout (40 % of calls fail, below any trip) with ``max_retries=5``: without a retry
  budget each task makes ~1.67 calls; with ``retry_budget=0.1`` the retries stay within the
  budget's promise (retries <= budget * first attempts + floor * window), every retry over it
  parked as ``retry_budget``, nothing lost;
- a 429 saying "come back in 3 s" (an exception's ``retry_after``): the retry comes no sooner;
  one saying more than ``resilience_max_countdown`` parks as ``delay_too_long``, due then.

The worlds are those of ``tests/test_task_worker.py`` (``tests/apps/workerapp.py``): the
dependency logs every call with the attempt's retries and Redis time.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from .support.waiting import wait_for
from .support.worker_world import World

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TASKS = 200
FAIL_SHARE = 0.4
MAX_RETRIES = 5
WINDOW = 300.0  # longer than the run: the promise then bounds the run's totals
FLOOR = 0.01  # retries a second: 3 over the window


def brownout(make_world: Callable[..., World], **budget: float) -> tuple[World, int, int]:
    """Run ``TASKS`` tasks through a 40 % brownout until each succeeded or parked: the world,
    and the dependency's first attempts and retries."""
    world = make_world(
        failure_threshold=1000,  # a brownout: the breaker never trips
        max_retries=MAX_RETRIES,
        backoff_base=0.02,
        backoff_cap=0.1,
        window=WINDOW,
        **budget,
    )
    world.redis.set(f"{world.prefix}:dep:fail_share", FAIL_SHARE)
    world.dependency(up=True)
    world.start_worker()
    ids = [world.publish("brownout", f"order-{n}") for n in range(TASKS)]
    wait_for(
        lambda: len(world.succeeded()) + len(world.parked()) >= len(ids),
        f"{TASKS} tasks to succeed or park",
        timeout=180.0,
    )
    log = world.dep_log()
    firsts = sum(1 for call in log if call["retries"] == 0)
    return world, firsts, len(log) - firsts


def test_without_a_budget_a_brownout_multiplies_the_calls(
    make_world: Callable[..., World],
) -> None:
    world, firsts, retries = brownout(make_world)
    per_task = (firsts + retries) / TASKS
    print(f"without a budget: {firsts} first attempts, {retries} retries, {per_task:.2f}/task")
    assert firsts == TASKS
    assert per_task > 1.4  # ~1 / (1 - 0.4): what the budget is for
    world.assert_ledger()


def test_with_a_budget_retries_stay_within_its_share_of_first_attempts(
    make_world: Callable[..., World],
) -> None:
    world, firsts, retries = brownout(make_world, retry_budget=0.1, min_retries_per_second=FLOOR)
    per_task = (firsts + retries) / TASKS
    print(f"with retry_budget=0.1: {firsts} first attempts, {retries} retries, {per_task:.2f}/task")
    # the promise, counted at the dependency
    assert firsts == TASKS
    assert retries <= 0.1 * firsts + FLOOR * WINDOW
    assert per_task <= 1.1 + FLOOR * WINDOW / TASKS
    # every retry refused is parked, never dropped: the ledger holds every task
    parked = world.parked()
    assert parked, "a 40 % brownout with 10 % of retries: some retries must have been refused"
    assert {entry.reason for entry in parked.values()} <= {"retry_budget", "retries_exhausted"}
    assert any(entry.reason == "retry_budget" for entry in parked.values())
    snap = world.resilience.breaker("dep").snapshot()
    refused = sum(1 for entry in parked.values() if entry.reason == "retry_budget")
    assert snap["retry_budget_refused_total"] == refused
    world.assert_ledger()


def test_a_429_with_retry_after_is_retried_no_sooner(make_world: Callable[..., World]) -> None:
    world = make_world(max_retries=3, backoff_base=0.1, backoff_cap=0.2)
    world.redis.set(f"{world.prefix}:dep:retry_after", 3)
    world.dependency(up=True)
    world.start_worker()
    task_id = world.publish("throttled", "order-1")
    wait_for(lambda: task_id in world.succeeded(), "the throttled task to succeed", timeout=60.0)
    first, second = world.dep_log()
    assert (first["retries"], second["retries"]) == (0, 1)
    assert second["time"] - first["time"] >= 3.0  # Redis time of each call
    world.assert_ledger()


def test_a_retry_after_past_max_countdown_parks_until_then(
    make_world: Callable[..., World],
) -> None:
    world = make_world(max_retries=3, max_countdown=10)
    world.redis.set(f"{world.prefix}:dep:retry_after", 120)
    world.dependency(up=True)
    world.start_worker()
    task_id = world.publish("throttled", "order-1")
    entry = world.wait_parked([task_id], timeout=60.0)[task_id]
    assert entry.reason == "delay_too_long"
    assert entry.due_at - entry.parked_at >= 120.0 - 1.0
    assert len(world.dep_log()) == 1
    world.assert_ledger()
