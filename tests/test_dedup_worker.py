"""Duplicates in real ``celery worker`` processes: ``deduplicate=True`` and reused task ids.

Two copies of one task id at the same time run its body once (the id is claimed atomically in
the admission's round trip), for as long as the hard time limit the worker applies (its own
``--time-limit`` too); a pool child killed with ``-9`` (or by that limit) gives its claim and
its bulkhead slot back from the worker's main process, so its message runs again at once and
never beside the dead body; a task id reused with other arguments parks a second entry instead
of merging into the first. Runs are counted per task id by the body itself (``<P>:once:runs``),
so a second run can't hide behind the ledger's sets.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any, cast

import pytest
import redis

from celery_resilience.config import CLAIM_LEASE_MARGIN

from .support.faults import FaultProxy, script_sha
from .support.waiting import wait_for
from .support.worker_world import World

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: The claim's lease in these tests (``resilience_dedup_lease``): long enough for the body,
#: short enough to wait for.
LEASE = 6.0
#: How long the first copy's body runs.
BODY = 2.0


def runs(world: World) -> dict[str, int]:
    raw = cast(dict[bytes, bytes], world.redis.hgetall(f"{world.prefix}:once:runs"))
    return {k.decode(): int(v) for k, v in raw.items()}


def starts(world: World, task_id: str) -> list[dict[str, Any]]:
    records = [json.loads(r) for r in world.redis.lrange(f"{world.prefix}:once:started", 0, -1)]
    return [r for r in records if r["task_id"] == task_id]


def logs(world: World) -> str:
    return "\n".join(worker.log() for worker in world.workers)


def publish_copy(world: World, task: str, task_id: str, *args: Any) -> None:
    """Another message with the same task id (a published duplicate)."""
    world.app.tasks[f"workerapp.{task}"].apply_async(args=args, task_id=task_id)


@pytest.mark.parametrize("task", ["once", "once_dep"])
@pytest.mark.parametrize("workers", ["prefork -c 2", "two solo workers"])
def test_two_copies_of_one_task_id_at_once_run_its_body_once_and_neither_is_lost(
    make_world: Callable[..., World], task: str, workers: str
) -> None:
    # Given a task with deduplicate=True (with a breaker and without) and two worker processes
    # that each take one message at a time
    world = make_world(dedup_lease=LEASE, prefetch_multiplier=1)
    if workers == "prefork -c 2":
        world.start_worker("prefork", 2)
    else:
        world.start_worker("solo")
        world.start_worker("solo")
    task_id = f"dup-{uuid.uuid4().hex[:8]}"

    # When two copies of one task id are published at once, the body taking a while
    world.published.append(task_id)
    publish_copy(world, task, task_id, "o-1", BODY)
    publish_copy(world, task, task_id, "o-1", BODY)

    # Then the body ran exactly once: the copy that found the id claimed waited in the broker
    # (no attempt used) and, once it came back, was skipped as done
    skipped = f"Task workerapp.{task}[{task_id}] already succeeded: skipped"
    published_at = time.monotonic()
    wait_for(
        lambda: skipped in logs(world) or runs(world).get(task_id, 0) > 1,
        "the second copy skipped (or run)",
        LEASE + 20.0,
    )
    print(f"second copy ended {time.monotonic() - published_at:.1f}s after the publish")
    assert runs(world) == {task_id: 1}
    assert len(starts(world, task_id)) == 1
    assert f"Task workerapp.{task}[{task_id}]: task id" in logs(world)  # it was kept
    # Nothing is left in the broker, and the ledger holds the id as succeeded
    wait_for(lambda: not world.broker_messages_of(task_id), "no message of the id left")
    assert world.state(task_id) == "SUCCESS"
    world.assert_ledger()


@pytest.mark.parametrize("task", ["once_order", "once_order_dep"])
def test_two_task_ids_for_one_order_at_once_run_the_body_once_and_both_end_known(
    make_world: Callable[..., World], task: str
) -> None:
    # Given a task with deduplicate="order:{order_id}" (without a breaker and with one) on a
    # prefork worker of two children, a claim's wait re-asked every second
    world = make_world(dedup_lease=LEASE, keep_delay=1, prefetch_multiplier=1)
    world.start_worker("prefork", 2)

    # When two task ids for one order are published at once, the body taking a while
    first = world.publish(task, "o-1", BODY)
    second = world.publish(task, "o-1", BODY)

    # Then the order's body ran once: the other task id waited in the broker while the key was
    # held, and was skipped as a duplicate once it succeeded
    duplicate = f"is a duplicate: workerapp.{task}:order:o-1 succeeded as"
    wait_for(lambda: duplicate in logs(world), "the other task id skipped", LEASE + 20.0)
    orders = world.redis.hgetall(f"{world.prefix}:once:orders")
    assert orders == {b"o-1": b"1"}
    # And both ids ended in a known state, nothing left in the broker: one succeeded, the
    # other a DUPLICATE naming it (each state written after the lines and markers above)
    wait_for(lambda: len(world.succeeded()) == 1, "the task id that ran to succeed")
    (ran,) = world.succeeded()
    skipped = ({first, second} - {ran}).pop()
    assert world.state(ran) == "SUCCESS"
    wait_for(lambda: world.state(skipped) == "DUPLICATE", "the other's state DUPLICATE")
    assert world.app.AsyncResult(skipped).info == {
        "key": f"workerapp.{task}:order:o-1",
        "task_id": ran,
    }
    wait_for(lambda: not world.broker_messages_of(skipped), "no message of the id left")
    world.assert_ledger(duplicates={skipped})


#: What a pool child killed mid-body held, by task: its claim on the task id (``once``), its
#: bulkhead slot (``once_slot``), both (``once_dep``).
HELD = {"once": "claim", "once_slot": "bulkhead slot", "once_dep": "claim and bulkhead slot"}


@pytest.mark.parametrize("task", list(HELD))
def test_a_child_killed_mid_body_frees_its_claim_and_slot_before_its_message_is_requeued(
    make_world: Callable[..., World], task: str
) -> None:
    # Given a task on a prefork child (acks_late, requeued when its worker is lost), holding a
    # claim on its task id for resilience_dedup_lease (600 s: no time limit) and/or the one
    # slot of the breaker's bulkhead for its call_lease (60 s)
    world = make_world(prefetch_multiplier=1, max_concurrent_calls=1)
    worker = world.start_worker("prefork", 2)
    task_id = world.publish(task, "o-1", 600.0)
    (first,) = wait_for(lambda: starts(world, task_id), "the first run to start")
    killed_at = world.now()

    # When its child is killed with -9 mid-body (kill -9, the OOM killer)
    worker.kill_child(first["pid"])

    # Then the worker's main process gave back what the dead body held before the requeue:
    # the message runs again at once (its body had not finished), not after the leases
    wait_for(lambda: len(starts(world, task_id)) == 2, f"the run after the kill ({HELD[task]})")
    waited = starts(world, task_id)[1]["time"] - killed_at
    print(f"second run started {waited:.2f}s after the kill")
    wait_for(lambda: task_id in world.succeeded(), "the task to succeed")
    assert runs(world) == {task_id: 2}
    # The body recorded its success before it returned; its slot is freed as it returns.
    wait_for(
        lambda: world.resilience.breaker("dep").snapshot()["calls_in_flight"] == 0,
        "the slot freed",
    )
    assert world.resilience.breaker("dep").snapshot()["bulkhead_rejected_total"] == 0
    world.assert_ledger()


def test_a_workers_own_time_limit_sets_how_long_a_claim_lasts(
    make_world: Callable[..., World],
) -> None:
    # Given a worker started with --time-limit 30, and a resilience_dedup_lease (2 s) shorter
    # than the body (5 s): the flag, not the setting, bounds how long a body may run
    world = make_world(dedup_lease=2, keep_delay=1, prefetch_multiplier=1)
    world.start_worker("prefork", 2, "--time-limit", "30")
    task_id = f"dup-{uuid.uuid4().hex[:8]}"

    # When two copies of one task id arrive at once
    world.published.append(task_id)
    publish_copy(world, "once", task_id, "o-1", 5.0)
    publish_copy(world, "once", task_id, "o-1", 5.0)

    # Then the second waits while the first runs (its claim lasts the limit + 10 s), and is
    # skipped once it succeeded: the body never ran twice, nor two at once
    skipped = f"Task workerapp.once[{task_id}] already succeeded: skipped"
    wait_for(lambda: skipped in logs(world) or runs(world).get(task_id, 0) > 1, "the copy", 60.0)
    assert runs(world) == {task_id: 1}
    assert len(starts(world, task_id)) == 1
    world.assert_ledger()


def beats(world: World, task_id: str) -> list[list[float]]:
    """Each run's heartbeats (``workerapp.beating``), in the order the runs started."""
    ran = int(world.redis.hget(f"{world.prefix}:beats:runs", task_id) or 0)
    key = f"{world.prefix}:beats:{task_id}"
    return [[float(t) for t in world.redis.lrange(f"{key}:{n}", 0, -1)] for n in range(1, ran + 1)]


def test_a_hard_time_limit_kills_the_body_before_its_handler_talks_to_redis(
    make_world: Callable[..., World], redis_url: str
) -> None:
    # Given the resilience Redis behind a proxy, which stalls the worker's main process in the
    # hard time limit's handler (its breaker record) for longer than the claim's margin
    target = redis.Redis.from_url(redis_url).connection_pool.connection_kwargs
    proxy = FaultProxy(int(target["port"]))
    try:
        world = make_world(
            redis=f"redis://{proxy.url}/{target['db']}",
            ledger=redis_url,  # the bodies' heartbeats do not go through the proxy
            redis_timeout=120,
            time_limit=6,
            keep_delay=1,
            prefetch_multiplier=1,
        )
        world.start_worker("prefork", 1)
        held = proxy.hold_on(script_sha("breaker/lua/record.lua"))
        task_id = world.publish("beating", 600.0)
        wait_for(lambda: beats(world, task_id), "the first run")
        world.start_worker("solo")  # takes the second copy: the first worker's slot is busy
        publish_copy(world, "beating", task_id, 600.0)

        # When the limit fires and its handler stalls past the claim's lease
        assert held.wait(60), "the handler never recorded the failure"
        time.sleep(CLAIM_LEASE_MARGIN + 4)
        proxy.release()

        # Then the second copy ran, once the claim was free, and never beside the first body:
        # the first was killed before the handler did anything
        wait_for(lambda: task_id in world.succeeded(), "the task to succeed", 60.0)
        runs_ = beats(world, task_id)
        assert len(runs_) == 2, runs_
        first, second = runs_
        print(f"first body's last beat {second[0] - first[-1]:.2f}s before the second began")
        assert first[-1] < second[0], "two bodies of one task id ran at once"
        world.assert_ledger()
    finally:
        proxy.close()


def test_a_task_id_reused_with_other_arguments_parks_both_messages(
    make_world: Callable[..., World],
) -> None:
    # Given an open breaker: every delivery of charge parks
    world = make_world()
    world.resilience.breaker("dep").force_open()
    world.start_worker("solo")
    task_id = f"reused-{uuid.uuid4().hex[:8]}"

    # When two messages share one task id with other arguments, and the first is published again
    world.published.append(task_id)
    for amount in (10, 99, 10):
        charge = world.app.tasks["workerapp.charge"]
        charge.apply_async(args=("o-1",), kwargs={"amount": amount}, task_id=task_id)

    # Then both bodies are parked, each once: the copy of the first merged into its entry
    def entries() -> list[Any]:
        return list(world.resilience.backout.list(limit=100))

    wait_for(lambda: len(entries()) >= 2, "two entries")
    wait_for(lambda: not world.broker_messages_of(task_id), "every message handled")
    kept = sorted((e.task_id, e.kwargs["amount"]) for e in entries())
    assert kept == [(task_id, 10), (task_id, 99)]
    assert world.dep_calls() == 0
