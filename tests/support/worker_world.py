"""One world of the worker tests: an app of ``tests/apps/workerapp.py`` under the test's key
prefix (its breaker, back-out store, fake dependency, result keys and Redis broker keys), a queue
nobody else consumes, the ``celery worker`` processes the test starts, and the ledger every
published task id must end in (succeeded, parked or, where a test expects it, a Celery FAILURE).

``make_world`` is a fixture of the whole suite (``conftest.py`` loads this module as a plugin).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from celery import Celery

from celery_resilience import Resilience
from celery_resilience.backout.entry import ParkedTask
from tests.apps.workerapp import broker_keyprefix, make_app

from .waiting import TIMEOUT, wait_for
from .worker_process import WorkerProcess


class World:
    """One test's app, Redis keys, queue, workers and ledger."""

    def __init__(self, prefix: str, redis_url: str, tmp_path: Path, **settings: Any) -> None:
        self.prefix = prefix
        self.queue = f"{prefix}-queue"
        self.env = {
            "WORKERAPP_PREFIX": prefix,
            "WORKERAPP_QUEUE": self.queue,
            "WORKERAPP_REDIS": redis_url,
            "WORKERAPP_BROKER": redis_url,
        }
        self.env.update({f"WORKERAPP_{k.upper()}": str(v) for k, v in settings.items()})
        self.app: Celery = make_app(self.env)
        self.redis = redis.Redis.from_url(redis_url)
        self.resilience = Resilience.for_app(self.app)
        self.tmp_path = tmp_path
        self.workers: list[WorkerProcess] = []
        self.published: list[str] = []

    # -- workers and tasks ---------------------------------------------------------------
    def start_worker(
        self, pool: str = "solo", concurrency: int = 1, *options: str
    ) -> WorkerProcess:
        log = self.tmp_path / f"worker-{len(self.workers)}-{pool}.log"
        worker = WorkerProcess(self.env, log, pool, concurrency, options=options)
        self.workers.append(worker)
        return worker.start()

    def publish(self, task: str, *args: Any, **kwargs: Any) -> str:
        result = self.app.tasks[f"workerapp.{task}"].apply_async(args=args, kwargs=kwargs)
        self.published.append(result.id)
        return str(result.id)

    def state(self, task_id: str) -> str:
        return str(self.app.AsyncResult(task_id).state)

    # -- the fake dependency ---------------------------------------------------------------
    def dependency(self, up: bool, latency: float = 0.0) -> None:
        self.redis.set(f"{self.prefix}:dep:up", "1" if up else "0")
        self.redis.set(f"{self.prefix}:dep:latency", str(latency))

    def dep_calls(self) -> int:
        return int(self.redis.get(f"{self.prefix}:dep:calls") or 0)

    def dep_log(self) -> list[dict[str, Any]]:
        return [json.loads(r) for r in self.redis.lrange(f"{self.prefix}:dep:log", 0, -1)]

    def now(self) -> float:
        seconds, micros = self.redis.time()
        return float(seconds) + micros / 1_000_000

    # -- outcomes --------------------------------------------------------------------------
    def succeeded(self) -> set[str]:
        members = cast(set[bytes], self.redis.smembers(f"{self.prefix}:ledger:succeeded"))
        return {m.decode() for m in members}

    def parked(self) -> dict[str, ParkedTask]:
        entries = self.resilience.backout.list(limit=100_000)
        by_task = {e.task_id: e for e in entries}
        assert len(by_task) == len(entries), f"a task parked twice: {entries}"
        return by_task

    def wait_parked(self, task_ids: list[str], timeout: float = TIMEOUT) -> dict[str, ParkedTask]:
        wanted = set(task_ids)
        wait_for(lambda: wanted <= set(self.parked()), f"{len(wanted)} parked", timeout)
        return {t: e for t, e in self.parked().items() if t in wanted}

    def assert_ledger(
        self, failed: set[str] | None = None, duplicates: set[str] | None = None
    ) -> Counter[str]:
        """Every published id in exactly one outcome: succeeded, parked or (expected) failed,
        or skipped as a ``duplicate`` of another id with its dedup key (state ``DUPLICATE``)."""
        failed = (failed or set()) | (duplicates or set())
        for task_id in duplicates or ():
            assert self.state(task_id) == "DUPLICATE", task_id
        published = set(self.published)
        assert len(published) == len(self.published)
        succeeded, parked = self.succeeded(), set(self.parked())
        assert not succeeded & parked, f"both succeeded and parked: {succeeded & parked}"
        assert not failed & (succeeded | parked)
        assert published == succeeded | parked | failed, (
            f"lost: {published - succeeded - parked - failed}, "
            f"unknown: {(succeeded | parked | failed) - published}"
        )
        counts = Counter(published=len(published), succeeded=len(succeeded), parked=len(parked))
        counts["failed"] = len(failed) - len(duplicates or ())
        counts["duplicates"] = len(duplicates or ())
        print(f"ledger: {dict(counts)}")
        return counts

    def broker_messages_of(self, task_id: str) -> list[str]:
        """Redis-broker keys (queues, ``unacked``...) that hold a message of ``task_id``."""
        holders = []
        for key in self.redis.scan_iter(match=f"{broker_keyprefix(self.prefix)}*"):
            kind = self.redis.type(key)
            if kind == b"list":
                values = self.redis.lrange(key, 0, -1)
            elif kind == b"hash":
                values = self.redis.hvals(key)
            else:
                continue
            if any(task_id.encode() in v for v in values):
                holders.append(key.decode())
        return holders

    def close(self) -> None:
        logs = [w.stop() for w in self.workers]
        for worker, log in zip(self.workers, logs, strict=True):
            # Captured output: pytest shows it only when the test failed.
            print(f"===== {worker.log_path.name} (pid {worker.process and worker.pid})\n{log}")
        if self.env["WORKERAPP_BROKER"].startswith("amqp"):
            with self.app.connection_for_write() as conn:
                channel = conn.default_channel
                channel.queue_delete(self.queue)
                channel.exchange_delete(self.queue)
        self.app.close()
        self.resilience.runtime.close()
        self.redis.close()


@pytest.fixture
def make_world(key_prefix: str, redis_url: str, tmp_path: Path) -> Iterator[Callable[..., World]]:
    """``make_world(**settings)``: settings become ``WORKERAPP_*`` variables of the workers."""
    worlds: list[World] = []

    def make(**settings: Any) -> World:
        world = World(key_prefix, redis_url, tmp_path, **settings)
        worlds.append(world)
        return world

    yield make
    for world in worlds:  # before ``key_prefix`` deletes the keys
        world.close()
