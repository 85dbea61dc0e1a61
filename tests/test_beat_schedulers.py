"""The drain under the beat schedulers people run: real ``celery beat -S ...`` processes.

One prefork worker (``tests.apps.beatapp``, 2 children) serves the whole module. Each test parks
tasks through it (the breaker forced open, the dependency down), starts beat with one
scheduler, lets a drain run while the breaker is still held open (it must replay nothing), then
resets the breaker: beat's next drains replay every entry, and the ledger (successful runs per
task id, ``deduplicate`` off so a second run would count) shows each ran exactly once.
Nothing in a test drains by itself: every replay comes from a drain that beat sent.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from celery_resilience import Resilience
from celery_resilience.backout import Filter
from celery_resilience.contrib.pytest import delete_prefix
from tests.apps import beatapp
from tests.apps.workerapp import broker_keyprefix
from tests.support.waiting import wait_for
from tests.support.worker_process import ROOT, WorkerProcess, spawn

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(120)]

DJANGO_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
REDBEAT_SCHEDULER = "redbeat.RedBeatScheduler"


class Beat:
    """One ``celery -A tests.apps.beatapp beat`` of ours, signalled by its PID only."""

    def __init__(self, env: Mapping[str, str], options: list[str], log_path: Path) -> None:
        self.env, self.options, self.log_path = dict(env), options, log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> Beat:
        command = [sys.executable, "-m", "celery", "-A", "tests.apps.beatapp", "beat"]
        command += [*self.options, "--max-interval", "1", "-l", "info"]
        self.process = spawn(command, self.env, self.log_path)
        wait_for(self.started, "beat to start", timeout)
        return self

    def started(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"beat exited with {self.process.returncode}:\n{self.log()}")
        return "beat: Starting..." in self.log()

    def sent(self) -> int:
        """Drains this beat has sent."""
        return self.log().count(f"Sending due task {beatapp.DRAIN_ENTRY}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@dataclass
class World:
    env: dict[str, str]
    prefix: str
    app: Any
    resilience: Resilience
    ledger: redis.Redis
    worker: WorkerProcess
    tmp: Path
    beats: list[Beat]

    def beat(self, name: str, options: list[str], **env: str) -> Beat:
        beat = Beat({**self.worker.env, **env}, options, self.tmp / f"{name}.log")
        self.beats.append(beat)
        return beat.start()

    def worker_log(self, since: int) -> str:
        return self.worker.log()[since:]

    def wait(self, predicate: Callable[[], Any], what: str, timeout: float) -> Any:
        """``wait_for``, with the ends of the worker's and the beats' logs on a timeout."""
        try:
            return wait_for(predicate, what, timeout)
        except AssertionError as exc:
            logs = [("worker", self.worker.log())] + [
                (b.log_path.name, b.log()) for b in self.beats
            ]
            tails = "\n".join(f"--- {name}\n{text[-3000:]}" for name, text in logs)
            raise AssertionError(f"{exc}\n{tails}") from None


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[World]:
    prefix = f"test-beat-{uuid.uuid4().hex[:10]}"
    tmp = tmp_path_factory.mktemp("beat")
    env = {
        "WORKERAPP_PREFIX": prefix,
        "WORKERAPP_BROKER": redis_url,
        "WORKERAPP_REDIS": redis_url,
        "WORKERAPP_QUEUE": f"{prefix}-queue",
        "WORKERAPP_PREFETCH_MULTIPLIER": "1",  # a drain never waits behind a prefetched task
    }
    ledger = redis.Redis.from_url(redis_url)
    ledger.set(f"{prefix}:dep:up", "1")
    app = beatapp.make_app(env)
    worker = WorkerProcess(env, tmp / "worker.log", "prefork", 2, app="tests.apps.beatapp")
    world = World(env, prefix, app, Resilience.for_app(app), ledger, worker, tmp, [])
    try:
        worker.start()
        yield world
    finally:
        for beat in world.beats:
            beat.stop()
        worker.stop()
        world.resilience.runtime.close()
        delete_prefix(ledger, prefix)
        ledger.close()


@pytest.fixture
def beats(world: World) -> Iterator[list[Beat]]:
    """The beats a test starts; stopped after it, whatever happened."""
    yield world.beats
    for beat in world.beats:
        beat.stop()
    world.beats.clear()


def park_through_worker(world: World, count: int, tag: str) -> list[str]:
    """``count`` charges parked by the worker, the breaker held open. The dependency is down
    meanwhile: a delivery that comes before the worker hears of the forced state fails, is
    retried, and is parked then, instead of running."""
    up_key = f"{world.prefix}:dep:up"
    world.ledger.set(up_key, "0")
    world.resilience.breaker("dep").force_open()
    ids = [f"{world.prefix}-{tag}-{i}" for i in range(count)]
    charge = world.app.tasks["workerapp.charge"]
    with world.app.producer_or_acquire() as producer:
        for task_id in ids:
            charge.apply_async((task_id,), task_id=task_id, producer=producer)
    store = world.resilience.backout

    def parked() -> bool:
        return store.count("dep", "parked") == count

    world.wait(parked, f"{count} tasks parked by the worker", timeout=30)
    entries = store.list("dep", "parked", 1000)
    assert sorted(e.task_id for e in entries) == sorted(ids)
    assert world.ledger.hlen(f"{world.prefix}:ledger:runs") == 0
    world.ledger.set(up_key, "1")
    return ids


def release_and_check_replayed_once(world: World, ids: list[str], since: int) -> None:
    """With a drain from beat seen to replay nothing while the breaker was held open, reset
    it: beat's drains replay every entry, each task id runs once, the store ends empty."""
    world.wait(lambda: drains_done(world.worker_log(since)), "a drain from beat", timeout=20)
    assert world.ledger.hlen(f"{world.prefix}:ledger:runs") == 0  # held open: nothing replayed
    world.resilience.breaker("dep").reset()
    runs_key = f"{world.prefix}:ledger:runs"

    def all_ran() -> bool:
        return world.ledger.hlen(runs_key) >= len(ids) and world.resilience.backout.count() == 0

    world.wait(all_ran, "every parked task replayed and run", timeout=30)
    time.sleep(1.5)  # more drains from beat: they must find nothing left to replay
    raw = cast(dict[bytes, bytes], world.ledger.hgetall(runs_key))
    runs = {k.decode(): int(v) for k, v in raw.items()}
    assert runs == dict.fromkeys(ids, 1), "a task id that did not run exactly once"
    assert world.resilience.backout.count() == 0
    assert world.resilience.runtime.backout_store.count(Filter(status="dead")) == 0
    assert "Drain: replayed=" in world.worker_log(since)
    world.ledger.delete(runs_key, f"{world.prefix}:ledger:succeeded")


def drains_done(log: str) -> int:
    return sum(
        "celery_resilience.drain[" in line and " succeeded in " in line for line in log.splitlines()
    )


def periodic_rows(db: Path) -> dict[str, tuple[Any, ...]]:
    """django-celery-beat's ``PeriodicTask`` rows: name -> (task, every, period, expire_seconds,
    enabled), read with plain SQL (the test process never sets up Django)."""
    with sqlite3.connect(db, timeout=10) as connection:
        rows = connection.execute(
            "SELECT p.name, p.task, i.every, i.period, p.expire_seconds, p.enabled"
            " FROM django_celery_beat_periodictask p"
            " LEFT JOIN django_celery_beat_intervalschedule i ON p.interval_id = i.id"
        ).fetchall()
    return {row[0]: tuple(row[1:]) for row in rows}


def migrate(env: Mapping[str, str]) -> None:
    """django-celery-beat's tables (and the helper's row with ``BEATAPP_SCHEDULE=none``)."""
    subprocess.run(
        [sys.executable, "-c", "from tests.apps.beatapp import migrate_and_make_row as m; m(1)"],
        cwd=ROOT,
        env=dict(env),
        check=True,
        timeout=180,
    )


# -- the tests -------------------------------------------------------------------------------


def test_default_scheduler_drains_and_replays_each_task_once(
    world: World, beats: list[Beat]
) -> None:
    ids = park_through_worker(world, 10, "default")
    since = len(world.worker.log())
    beat = world.beat("beat-default", ["--schedule", str(world.tmp / "schedule-default")])
    release_and_check_replayed_once(world, ids, since)
    assert beat.sent() >= 2


def test_django_celery_beat_syncs_the_entry_into_its_table_and_drains(
    world: World, beats: list[Beat]
) -> None:
    db = world.tmp / "django-beat.sqlite3"
    env = {**world.worker.env, "BEATAPP_DJANGO_DB": str(db)}
    migrate(env)
    assert beatapp.DRAIN_ENTRY not in periodic_rows(db)
    ids = park_through_worker(world, 10, "django")
    since = len(world.worker.log())
    beat = world.beat("beat-django", ["-S", DJANGO_SCHEDULER], BEATAPP_DJANGO_DB=str(db))
    # The DatabaseScheduler copied app.conf.beat_schedule's entry into its table at start.
    row = wait_for(lambda: periodic_rows(db).get(beatapp.DRAIN_ENTRY), "the synced row", 10)
    task, every, period, _, enabled = row
    assert (task, every, period, enabled) == ("celery_resilience.drain", 1, "seconds", 1)
    release_and_check_replayed_once(world, ids, since)
    assert beat.sent() >= 2


def test_periodic_task_makes_a_row_whose_drains_expire(
    world: World, beats: list[Beat], redis_client: redis.Redis
) -> None:
    """The helper's row (no ``beat_schedule`` entry) keeps the drain's ``expires``: beat's
    drains, sent to a queue no worker reads, carry it."""
    db = world.tmp / "django-helper.sqlite3"
    queue = f"{world.prefix}-unread"
    env = {"BEATAPP_DJANGO_DB": str(db), "BEATAPP_SCHEDULE": "none", "WORKERAPP_QUEUE": queue}
    migrate({**world.worker.env, **env})
    row = periodic_rows(db)[beatapp.DRAIN_ENTRY]
    assert row == ("celery_resilience.drain", 1, "seconds", 1, 1)
    world.beat("beat-helper", ["-S", DJANGO_SCHEDULER], **env)
    key = broker_keyprefix(world.prefix) + queue
    raw = wait_for(
        lambda: cast(bytes | None, redis_client.lindex(key, 0)), "a drain in the unread queue", 15
    )
    headers = json.loads(raw)["headers"]
    assert headers["task"] == "celery_resilience.drain"
    assert headers["expires"] is not None


def test_redbeat_syncs_the_entry_into_redis_and_drains(
    world: World, beats: list[Beat], redis_client: redis.Redis
) -> None:
    """A second RedBeat started by mistake waits on RedBeat's own lock: it sends nothing."""
    ids = park_through_worker(world, 10, "redbeat")
    since = len(world.worker.log())
    beat = world.beat("beat-redbeat", ["-S", REDBEAT_SCHEDULER])
    second = world.beat("beat-redbeat-second", ["-S", REDBEAT_SCHEDULER])
    entry_key = f"{world.prefix}:redbeat:{beatapp.DRAIN_ENTRY}"
    raw = wait_for(
        lambda: cast(bytes | None, redis_client.hget(entry_key, "definition")),
        "the entry in Redis",
        10,
    )
    definition = json.loads(raw)
    assert definition["task"] == "celery_resilience.drain"
    assert definition["options"] == {"expires": 1.0}
    release_and_check_replayed_once(world, ids, since)
    assert beat.sent() >= 2
    assert second.sent() == 0


def test_two_beats_by_mistake_still_replay_each_task_once(world: World, beats: list[Beat]) -> None:
    """Two default-scheduler beats both send drains, on two pool processes: each pass takes the
    drain lock (one that meets another is turned away) and claims under a lease, and no task id
    runs twice. At 10/s the 40 entries take several passes."""
    ids = park_through_worker(world, 40, "two")
    since = len(world.worker.log())
    first = world.beat("beat-one", ["--schedule", str(world.tmp / "schedule-one")])
    second = world.beat("beat-two", ["--schedule", str(world.tmp / "schedule-two")])
    release_and_check_replayed_once(world, ids, since)
    assert first.sent() >= 2
    assert second.sent() >= 2
    assert world.worker_log(since).count("Task celery_resilience.drain[") >= 4
