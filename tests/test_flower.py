"""What an operator sees in Flower: a real ``celery worker -E`` and a real ``celery flower``.

One worker (prefork, two children) and one Flower share a world of their own
(``tests/apps/flowerapp.py``: ``tests/apps/workerapp.py``'s key prefix, queue, breaker ``dep`` and
Redis-flag dependency, with task events on). Everything is asserted through Flower's HTTP API,
as a dashboard or a script would read it:

- a parked task is ``PARKED`` in ``/api/tasks?state=PARKED``, with its reason in ``result`` and
  its exception in ``exception`` (Flower shows Celery's own task fields only: the event's
  ``reason``, ``breaker`` and ``entry_id`` fields are kept in its state but never shown);
- ``/metrics`` counts ``task-parked`` in ``flower_events_total``;
- a replayed task keeps its id and ends ``SUCCESS`` in ``/api/task/info/<id>``;
- a breaker tripped by failures inside the worker counts ``resilience-breaker-opened`` once,
  for the worker's own hostname, in ``/workers?json=1``.

And once in headless Chromium, as a person would see it: Flower's task page filtered on
``PARKED`` lists the parked tasks (the documentation shows that screenshot,
``docs/_static/shots/flower-parked.png``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from celery import Celery

from celery_resilience import Resilience
from celery_resilience.contrib.pytest import delete_prefix

from .apps.flowerapp import make_app
from .support.browser import chrome, keep_for_docs, missing_browser
from .support.redis_server import free_port
from .support.services import REDIS_URL
from .support.waiting import wait_for
from .support.worker_process import READY_TIMEOUT, WorkerProcess, force_open_for_workers, spawn

# A test's own waits (Flower's view: 120 s) end before this, with what they saw.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

WAIT = 20.0
TASK = "workerapp.charge"


class EventWorker(WorkerProcess):
    """``celery -A tests.apps.flowerapp worker -E``: task events on, event heartbeats on."""

    @property
    def nodename(self) -> str:
        """The hostname the worker puts in its events (``%h`` expanded as Celery does)."""
        return self.hostname.replace("%h", socket.gethostname())

    def command(self) -> list[str]:
        """The plain worker's, with task events on (``-E``) and event heartbeats kept."""
        return ["-E" if arg == "--without-heartbeat" else arg for arg in super().command()]


class FlowerProcess:
    """``celery -A tests.apps.flowerapp flower`` on a free loopback port, API open without auth."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.env = {**env, "FLOWER_UNAUTHENTICATED_API": "true"}
        self.log_path = log_path
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = READY_TIMEOUT) -> FlowerProcess:
        command = [
            sys.executable, "-m", "celery", "-A", "tests.apps.flowerapp", "flower",
            f"--port={self.port}", "--address=127.0.0.1",
        ]  # fmt: skip
        self.process = spawn(command, self.env, self.log_path)
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"flower exited with {self.process.returncode}:\n{self.log()}")
            with contextlib.suppress(OSError):
                if self.get("/healthcheck").strip() == "OK":
                    return self
            if time.monotonic() > deadline:
                raise TimeoutError(f"flower not answering after {timeout}s:\n{self.log()}")
            time.sleep(0.1)

    def get(self, path: str) -> str:
        url = f"http://127.0.0.1:{self.port}{path}"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())

    def json(self, path: str) -> Any:
        return json.loads(self.get(path))

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)

    # -- what the tests read -----------------------------------------------------------------
    def tasks(self, state: str | None = None) -> dict[str, dict[str, Any]]:
        query = f"?state={state}" if state else ""
        return dict(self.json(f"/api/tasks{query}"))

    def task(self, task_id: str) -> dict[str, Any] | None:
        try:
            return dict(self.json(f"/api/task/info/{task_id}"))
        except urllib.error.HTTPError as exc:
            if exc.code == 404:  # no event about it yet
                return None
            raise

    def workers(self) -> dict[str, dict[str, Any]]:
        return {w["hostname"]: w for w in self.json("/workers?json=1")["data"]}

    def events_total(self, event_type: str, worker: str) -> float:
        """``flower_events_total{type=..., worker=...}`` summed over task names."""
        from prometheus_client.parser import text_string_to_metric_families

        total = 0.0
        for family in text_string_to_metric_families(self.get("/metrics")):
            for sample in family.samples:
                if (
                    sample.name == "flower_events_total"
                    and sample.labels.get("type") == event_type
                    and sample.labels.get("worker") == worker
                ):
                    total += sample.value
        return total


@dataclass
class World:
    prefix: str
    app: Celery
    resilience: Resilience
    redis: redis.Redis
    worker: EventWorker
    flower: FlowerProcess

    def dependency(self, up: bool) -> None:
        self.redis.set(f"{self.prefix}:dep:up", "1" if up else "0")

    def publish(self, n: int, label: str) -> list[str]:
        task = self.app.tasks[TASK]
        return [str(task.apply_async(args=(f"{label}-{i}",)).id) for i in range(n)]

    def succeeded(self) -> set[str]:
        members = cast(set[bytes], self.redis.smembers(f"{self.prefix}:ledger:succeeded"))
        return {m.decode() for m in members}

    def parked_entries(self, task_ids: list[str]) -> dict[str, Any]:
        wanted = set(task_ids)
        entries = self.resilience.backout.list(limit=10_000)
        return {e.task_id: e for e in entries if e.task_id in wanted}

    def wait_flower_parked(self, task_ids: list[str]) -> dict[str, dict[str, Any]]:
        def seen() -> dict[str, dict[str, Any]] | None:
            tasks = self.flower.tasks(state="PARKED")
            return tasks if set(task_ids) <= set(tasks) else None

        # Flower sees the events as it polls them: on a loaded host that can take a while. The
        # message says how many the store holds by then (parked, or not yet, or not heard of).
        try:
            return dict(wait_for(seen, f"{len(task_ids)} tasks PARKED in Flower", timeout=120.0))
        except AssertionError as timeout:
            stored = len(self.parked_entries(task_ids))
            raise AssertionError(
                f"{timeout}; {stored} of them parked in the store\n"
                f"--- worker log (end)\n{self.worker.log()[-6000:]}\n"
                f"--- flower log (end)\n{self.flower.log()[-6000:]}"
            ) from None


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    prefix = f"test-flower-{uuid.uuid4().hex[:8]}"
    env = {
        "WORKERAPP_PREFIX": prefix,
        "WORKERAPP_QUEUE": f"{prefix}-queue",
        "WORKERAPP_REDIS": REDIS_URL,
        "WORKERAPP_BROKER": REDIS_URL,
        "WORKERAPP_FAILURE_THRESHOLD": "3",
        "WORKERAPP_OPEN_TIMEOUT": "60",
        "WORKERAPP_MAX_RETRIES": "10",  # the trip, not the retry limit, parks them
        "WORKERAPP_BACKOFF_BASE": "0.1",
    }
    logs = tmp_path_factory.mktemp("flower")
    app = make_app(env)
    client = redis.Redis.from_url(REDIS_URL)
    worker = EventWorker({**env}, logs / "worker.log", pool="prefork", concurrency=2)
    flower = FlowerProcess({**os.environ, **env}, logs / "flower.log")
    try:
        flower.start()
        worker.start()
        yield World(prefix, app, Resilience.for_app(app), client, worker, flower)
    finally:
        worker_log = worker.stop()
        flower.stop()
        print(f"--- worker log\n{worker_log}\n--- flower log\n{flower.log()}")
        delete_prefix(client, prefix)
        client.close()


def test_parked_tasks_show_in_flower_and_replay_to_success(world: World) -> None:
    breaker = world.resilience.breaker("dep")
    node = world.worker.nodename
    parked_before = world.flower.events_total("task-parked", node)
    succeeded_before = world.flower.events_total("task-succeeded", node)
    world.dependency(up=False)
    force_open_for_workers(breaker)
    task_ids = world.publish(3, "forced")

    tasks = world.wait_flower_parked(task_ids)
    entries = wait_for(
        lambda: (found := world.parked_entries(task_ids)) and len(found) == 3 and found,
        "3 entries in the back-out store",
    )
    for task_id in task_ids:
        task, entry = tasks[task_id], entries[task_id]
        assert task["state"] == "PARKED"
        assert task["name"] == TASK
        assert task["worker"] == world.worker.nodename
        # The reason, breaker and entry id: in ``result`` (shown and searchable in Flower).
        assert task["result"] == f"parked: reason=breaker_open breaker=dep entry={entry.id}"
        assert task["exception"] == (
            "celery_resilience.errors.BreakerOpen: breaker 'dep' is forced_open"
        )
        # The event's own fields are not part of Flower's task view.
        assert not {"reason", "breaker", "entry_id", "due_at"} & set(task)
    # Flower's search finds them by reason too (``result`` is a search field).
    found = world.flower.json("/api/tasks?search=result:breaker_open")
    assert set(task_ids) <= set(found)

    assert world.flower.events_total("task-parked", node) == parked_before + 3
    assert world.flower.workers()[node]["task-parked"] == parked_before + 3

    # The dependency is back: replay each entry; the task keeps its id and succeeds.
    breaker.reset()
    world.dependency(up=True)
    for task_id in task_ids:
        world.resilience.backout.replay(entries[task_id].id)

    def all_succeeded() -> bool:
        infos = [world.flower.task(task_id) for task_id in task_ids]
        return all(info is not None and info["state"] == "SUCCESS" for info in infos)

    wait_for(all_succeeded, "the replayed tasks SUCCESS in Flower")
    for task_id in task_ids:
        info = world.flower.task(task_id)
        assert info is not None
        assert info["uuid"] == task_id
        assert info["result"] == f"{{'order_id': 'forced-{task_ids.index(task_id)}', 'amount': 1}}"
    assert set(task_ids) <= world.succeeded()
    assert world.parked_entries(task_ids) == {}
    assert world.flower.tasks(state="PARKED").keys().isdisjoint(task_ids)
    assert world.flower.events_total("task-succeeded", node) == succeeded_before + 3


def test_breaker_tripped_in_the_worker_counts_for_the_worker(world: World) -> None:
    breaker = world.resilience.breaker("dep")
    breaker.reset()
    node = world.worker.nodename
    before = world.flower.workers().get(node, {})
    parked_before = world.flower.events_total("task-parked", node)
    retried_before = world.flower.events_total("task-retried", node)
    assert before.get("resilience-breaker-opened", 0) == 0

    world.dependency(up=False)
    task_ids = world.publish(3, "tripped")  # three failures: failure_threshold
    # Each was retried, then parked: PARKED, though its retry's task-retried came first (the
    # pool child sends it before the retry goes out).
    tasks = world.wait_flower_parked(task_ids)
    wait_for(
        lambda: world.flower.events_total("task-retried", node) - retried_before >= 3,
        "each task's task-retried, counted for the worker",
    )
    entries = world.parked_entries(task_ids)
    assert set(entries) == set(task_ids)
    for task_id in task_ids:
        assert tasks[task_id]["result"].startswith("parked: reason=breaker_open breaker=dep ")
        assert entries[task_id].reason == "breaker_open"
    snapshot = breaker.snapshot()
    assert snapshot["state"] == "open"
    assert snapshot["opened_total"] == 1

    # Exactly one ``opened`` event for the trip, counted for the worker that made it.
    wait_for(
        lambda: world.flower.workers().get(node, {}).get("resilience-breaker-opened"),
        "resilience-breaker-opened in /workers",
    )
    time.sleep(0.5)  # a second event would have arrived by now
    workers = world.flower.workers()
    assert workers[node]["resilience-breaker-opened"] == 1
    others = {name: w.get("resilience-breaker-opened") for name, w in workers.items()}
    assert sum(n or 0 for n in others.values()) == 1, others
    assert world.flower.events_total("task-parked", node) == parked_before + 3
    # Flower counts only task events in /metrics: breaker events have no series there.
    assert world.flower.events_total("resilience-breaker-opened", node) == 0


def test_task_replayed_goes_out_only_for_what_was_published(world: World) -> None:
    """The event follows the publish: an entry the broker never got shows no REPLAYED."""
    from celery_resilience import ParkedTask

    world.dependency(up=True)
    world.resilience.breaker("dep").reset()
    queue = world.app.conf.task_default_queue
    now = world.resilience.runtime.now()
    good, bad = (
        ParkedTask.new(
            task_name=TASK,
            task_id=f"{label}-{uuid.uuid4().hex[:8]}",
            reason="breaker_open",
            breaker="dep",
            args=[label],
            options={"queue": queue, **extra},
            parked_at=now - 5,
            due_at=now - 5,
        )
        for label, extra in (("good", {}), ("bad", {"serializer": "gone"}))
    )
    for entry in (good, bad):
        world.resilience.runtime.backout_store.park(entry)

    report = world.resilience.drain(breaker="dep")

    assert report.dead == 1
    assert report.replayed >= 1  # the good one, and what an earlier test left parked
    wait_for(
        lambda: (info := world.flower.task(good.task_id)) and info["state"] == "SUCCESS",
        "the published replay SUCCESS in Flower",
    )
    assert world.flower.task(bad.task_id) is None  # no task-replayed for what never went out


#: The page a person opens: Flower's task list, filtered on the state through its URL.
PARKED_ROWS = """
return [...document.querySelectorAll('#tasks-table tbody tr')]
    .filter((row) => row.textContent.includes('PARKED')).map((row) => row.id);
"""


@pytest.mark.skipif(
    missing_browser() is not None and not os.environ.get("CI"), reason=missing_browser() or ""
)
def test_flowers_task_page_filtered_on_parked_lists_them(world: World, tmp_path: Path) -> None:
    # Given three tasks parked by a breaker forced open
    breaker = world.resilience.breaker("dep")
    force_open_for_workers(breaker)
    task_ids = world.publish(3, "parked")
    world.wait_flower_parked(task_ids)
    driver = chrome(tmp_path / "chromium-profile")
    try:
        # A laptop's screen, as the admin's screenshots are taken.
        viewport = {"width": 1280, "height": 720, "deviceScaleFactor": 1, "mobile": False}
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", viewport)

        # When a person opens the task page filtered on PARKED
        driver.get(f"http://127.0.0.1:{world.flower.port}/tasks?state=PARKED")

        # Then its rows are those tasks, each in state PARKED
        def parked_rows() -> list[str] | None:
            ids: list[str] = driver.execute_script(PARKED_ROWS)
            return ids if set(task_ids) <= set(ids) else None

        rows = wait_for(
            parked_rows, "the parked tasks in Flower's task page", timeout=WAIT, poll=0.1
        )
        assert set(rows) <= set(world.flower.tasks(state="PARKED"))
        assert driver.find_element("css selector", "input[type=search]").get_attribute("value") == (
            "state:PARKED"
        )
        keep_for_docs("flower-parked.png", driver.get_screenshot_as_png())
    finally:
        driver.quit()
        breaker.reset()
