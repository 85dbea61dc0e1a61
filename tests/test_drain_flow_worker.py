"""Beat's drain with a real prefork worker: one pass sent by hand, and the passes it sends
itself bring a backlog of several passes home without beat, each replay run once."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
import redis

from celery_resilience import ParkedTask, Resilience
from celery_resilience.contrib.pytest import delete_prefix

from .apps import workerapp
from .support.waiting import wait_for
from .support.worker_process import WorkerProcess

pytestmark = pytest.mark.integration


@pytest.fixture
def world_env(redis_url: str, redis_client: redis.Redis) -> Iterator[dict[str, str]]:
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    yield {"WORKERAPP_PREFIX": prefix, "WORKERAPP_REDIS": redis_url, "WORKERAPP_QUEUE": prefix}
    delete_prefix(redis_client, prefix)


def test_the_drains_next_passes_bring_a_backlog_home_without_beat(
    world_env: dict[str, str], redis_client: redis.Redis, tmp_path: Path
) -> None:
    # Given 40 parked charges, the dependency up, and the defaults: a depth of 8, a slow start
    # of 2 (so no single pass may send them all)
    prefix = world_env["WORKERAPP_PREFIX"]
    redis_client.set(f"{prefix}:dep:up", "1")
    worker = WorkerProcess(world_env, tmp_path / "worker.log", pool="prefork", concurrency=2)
    worker.start()
    app = workerapp.make_app(world_env)
    resilience = Resilience.install(app, Resilience(app))
    try:
        now = time.time()
        ids = [f"{prefix}-order-{i}" for i in range(40)]
        for i, task_id in enumerate(ids):
            resilience.runtime.backout_store.park(
                ParkedTask.new(
                    task_name="workerapp.charge",
                    task_id=task_id,
                    reason="breaker_open",
                    breaker="dep",
                    args=[f"order-{i}"],
                    options={"queue": world_env["WORKERAPP_QUEUE"]},
                    parked_at=now - 60,
                    due_at=now - 60,
                )
            )

        # When one drain pass is sent (as beat would, once)
        app.tasks["celery_resilience.drain"].apply_async()

        # Then its next passes replay everything, and each charge runs once
        runs = f"{prefix}:ledger:runs"
        # (the last batch's entries leave the store once all its publishes returned: a charge
        # may run before that)
        wait_for(
            lambda: redis_client.hlen(runs) == 40 and resilience.backout.count() == 0,
            "every charge run and the store empty",
            60,
        )
        raw = cast(dict[bytes, bytes], redis_client.hgetall(runs))
        assert {k.decode(): int(v) for k, v in raw.items()} == dict.fromkeys(ids, 1)
        passes = worker.log().count("Task celery_resilience.drain[") // 2  # received, succeeded
        assert passes >= 4  # 2, 4, 8, then no more than the queue's room at a time
    finally:
        resilience.runtime.close()
        app.close()
        worker.stop()
