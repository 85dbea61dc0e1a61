"""Where the drain runs never decides an entry's fate: a task is published by its name.

A process that is not a worker (CLI, web) loads the app's task modules first, as a worker does,
so that the arguments' check can run; a process that still lacks the task (a drain on a worker
that serves other queues) publishes the entry by name all the same, for a worker that has it.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

from celery_resilience import ParkedTask, Resilience
from celery_resilience.contrib.pytest import delete_prefix

from .apps import workerapp
from .support.waiting import wait_for
from .support.worker_process import WorkerProcess

pytestmark = pytest.mark.integration


def test_replay_loads_the_apps_task_modules_first(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    sys.modules.pop("tests.apps.lazy_tasks", None)
    app = Celery("lazy", broker=redis_url, set_as_current=False)
    app.conf.imports = ("tests.apps.lazy_tasks",)
    app.conf.resilience_key_prefix = key_prefix
    queue = f"{key_prefix}-queue"
    resilience = Resilience(app)
    assert "lazy.charge" not in app.tasks
    entry = ParkedTask.new(
        task_name="lazy.charge",
        task_id=str(uuid.uuid4()),
        reason="breaker_open",
        args=[7],
        options={"queue": queue},
    )
    resilience.runtime.backout_store.park(entry)
    try:
        resilience.backout.replay(entry.id)
        assert redis_client.llen(queue) == 1
        assert resilience.backout.count() == 0
    finally:
        redis_client.delete(queue)


@pytest.fixture
def world_env(redis_url: str, redis_client: redis.Redis) -> Iterator[dict[str, str]]:
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    yield {"WORKERAPP_PREFIX": prefix, "WORKERAPP_REDIS": redis_url, "WORKERAPP_QUEUE": prefix}
    delete_prefix(redis_client, prefix)


def test_a_drain_on_a_worker_without_the_task_replays_it_for_one_that_has_it(
    world_env: dict[str, str], redis_client: redis.Redis, tmp_path: Path
) -> None:
    # Given a worker that has workerapp.charge, and a drain in a process whose app lacks it
    # (a worker of another queue: beat's task runs wherever a worker takes it)
    worker = WorkerProcess(world_env, tmp_path / "worker.log").start()
    try:
        prefix = world_env["WORKERAPP_PREFIX"]
        redis_client.set(f"{prefix}:dep:up", "1")
        app = workerapp.make_app(world_env)
        app.tasks.pop("workerapp.charge")
        resilience = Resilience.install(app, Resilience(app))
        task_id = str(uuid.uuid4())
        entry = ParkedTask.new(
            task_name="workerapp.charge",
            task_id=task_id,
            reason="breaker_open",
            breaker="dep",
            args=["order-1"],
            options={"queue": world_env["WORKERAPP_QUEUE"]},
            parked_at=time.time() - 60,
            due_at=time.time() - 60,
        )
        resilience.runtime.backout_store.park(entry)

        report = app.tasks["celery_resilience.drain"].apply().get()

        # Then it is replayed, not dead, and the worker that has the task runs it
        assert (report["replayed"], report["dead"]) == (1, 0)
        assert resilience.backout.count() == 0
        succeeded = f"{prefix}:ledger:succeeded"
        wait_for(lambda: redis_client.sismember(succeeded, task_id), "the replay ran", 30)
        resilience.runtime.close()
        app.close()
    finally:
        worker.stop()
