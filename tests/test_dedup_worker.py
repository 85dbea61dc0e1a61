"""Duplicates in real ``celery worker`` processes: ``deduplicate=True`` and reused task ids.

Two copies of one task id at the same time run its body once (the id is claimed atomically in
the admission's round trip); a claimant killed with ``-9`` blocks the id only until its claim's
lease ends; a task id reused with other arguments parks a second entry instead of merging into
the first. Runs are counted per task id by the body itself (``<P>:once:runs``), so a second run
can't hide behind the ledger's sets.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from .test_task_worker import World, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: The claim's lease in these tests (``resilience_dedup_lease``): long enough for the body,
#: short enough to wait for.
LEASE = 6.0
#: How long the first copy's body runs.
BODY = 2.0


@pytest.fixture
def make_world(key_prefix: str, redis_url: str, tmp_path: Path) -> Iterator[Callable[..., World]]:
    """``make_world(**settings)``: a world of ``tests/test_task_worker.py``, closed after."""
    worlds: list[World] = []

    def make(**settings: Any) -> World:
        worlds.append(World(key_prefix, redis_url, tmp_path, **settings))
        return worlds[-1]

    yield make
    for world in worlds:  # before ``key_prefix`` deletes the keys
        world.close()


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


def test_a_claimant_killed_mid_body_blocks_the_task_id_only_until_its_lease_ends(
    make_world: Callable[..., World],
) -> None:
    # Given a task with deduplicate=True running on a prefork child (acks_late, requeued when
    # its worker is lost)
    world = make_world(dedup_lease=LEASE, prefetch_multiplier=1)
    worker = world.start_worker("prefork", 2)
    task_id = world.publish("once", "o-1", 60.0)
    (first,) = wait_for(lambda: starts(world, task_id), "the first run to start")

    # When its child is killed with -9 mid-body (the message comes straight back: requeued)
    worker.kill_child(first["pid"])

    # Then the redelivered copy does not run beside a claim that may still be running: it waits
    # in the broker until the claim's lease has ended, and runs then, once
    wait_for(lambda: len(starts(world, task_id)) == 2, "the run after the lease", LEASE + 20.0)
    second = starts(world, task_id)[1]
    waited = second["time"] - first["time"]
    print(f"second run started {waited:.2f}s after the first (lease {LEASE}s)")
    # The claim was taken just before the first start (a moment, longer on a loaded machine);
    # without one the redelivered copy runs about a second after the kill.
    assert waited >= LEASE - 1.0
    assert f"Task workerapp.once[{task_id}]: task id" in worker.log()  # kept, not dropped
    wait_for(lambda: task_id in world.succeeded(), "the task to succeed")
    assert runs(world) == {task_id: 2}
    world.assert_ledger()


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
