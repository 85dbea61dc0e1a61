"""End to end: a real prefork worker and a real beat ride out an outage with no one's help.

The dependency of ``tests/apps/e2eapp.py`` (a Redis flag) is down while 60 ``charge`` tasks are
published: the breaker opens and every task ends in the back-out store. Then the dependency comes
back and nobody touches anything: the breaker half-opens after its ``open_timeout``, beat's drain
releases a probe, the probe closes it, the next drains release the rest; the store ends empty and
the ledger shows every published task id succeeded exactly once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import pytest
import redis

from celery_resilience import Resilience
from celery_resilience.backout import Filter
from celery_resilience.breaker import Breaker
from tests.apps import e2eapp
from tests.support.waiting import wait_for
from tests.support.worker_process import start_time

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parent.parent
TASKS = 60
START_TIMEOUT = 30.0
PARK_TIMEOUT = 30.0
RECOVER_TIMEOUT = 45.0
STOP_TIMEOUT = 15.0


class Process:
    """One ``celery -A tests.apps.e2eapp ...`` subprocess of ours, signalled by its PID only."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log: Path, ready: str):
        self.name = name
        self.command = [sys.executable, "-m", "celery", "-A", "tests.apps.e2eapp", *args]
        self.env = env  # read at start: a test may add settings before it starts the process
        self.log_path = log
        self.ready = ready
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Process:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command,
                cwd=ROOT,
                env={**os.environ, **self.env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C of pytest does not reach it
            )
        return self

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while self.ready not in self.log():
            self.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} not ready after {timeout}s:\n{self.log()}")
            time.sleep(0.05)

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def children(self) -> dict[int, int | None]:
        """Direct children (prefork pool processes) by PID, with their start times."""
        pids: set[int] = set()
        if self.process is not None:
            for task in Path(f"/proc/{self.process.pid}/task").glob("*"):
                with contextlib.suppress(OSError):
                    pids.update(int(p) for p in (task / "children").read_text().split())
        return {pid: start_time(pid) for pid in pids}

    def stop(self) -> None:
        """SIGTERM (warm shutdown), then SIGKILL by PID, the pool children included."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        children = self.children()
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_TIMEOUT)
        for pid, started in children.items():  # only if the PID still names the same process
            if started is not None and start_time(pid) == started:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def waited(
    what: str, condition: Callable[[], bool], timeout: float, processes: list[Process]
) -> float:
    """The seconds until ``condition`` held (``wait_for``); fails at once if one of
    ``processes`` died, and with their logs on a timeout."""
    started = time.monotonic()

    def held() -> bool:
        for process in processes:
            process.check_alive()
        return condition()

    try:
        wait_for(held, what, timeout, poll=0.05)
    except AssertionError as exc:
        logs = "\n".join(f"--- {p.name}\n{p.log()[-6000:]}" for p in processes)
        pytest.fail(f"{exc}\n{logs}")
    return time.monotonic() - started


@pytest.fixture
def world(
    key_prefix: str, redis_url: str, tmp_path: Path
) -> Iterator[tuple[dict[str, str], list[Process]]]:
    env = {
        "E2EAPP_PREFIX": key_prefix,
        "E2EAPP_BROKER": redis_url,
        "E2EAPP_REDIS": redis_url,
        "E2EAPP_QUEUE": f"{key_prefix}-queue",
    }
    worker = Process(
        "worker",
        [
            "worker",
            "-P",
            "prefork",
            "-c",
            "2",
            "-Q",
            env["E2EAPP_QUEUE"],
            "-n",
            f"e2e-{key_prefix}@%h",
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
            "-l",
            "info",
        ],
        env,
        tmp_path / "worker.log",
        ready=" ready.",
    )
    beat = Process(
        "beat",
        [
            "beat",
            "--schedule",
            str(tmp_path / "beat-schedule"),
            "--max-interval",
            "1",
            "-l",
            "info",
        ],
        env,
        tmp_path / "beat.log",
        ready="beat: Starting...",
    )
    processes = [worker, beat]
    try:
        yield env, processes  # the test starts them (after adding to ``env`` if it likes)
    finally:
        for process in reversed(processes):
            process.stop()
        # Keys (breaker, store, ledger, the broker's queue and bindings) go with key_prefix.


def calls_at_first_opening(
    breaker: Breaker, calls: Callable[[], int], processes: list[Process]
) -> tuple[int, bool]:
    """The dependency's calls once the breaker first opened, and whether that count is sure to
    come before any probe: a probe needs the open timeout and a drain run, but a loaded host can
    be that slow to look. It is, if the breaker, read after the count, is still in its first
    opening (a failed probe would have opened it a second time)."""
    waited(
        "the breaker opened",
        lambda: breaker.snapshot()["opened_total"] >= 1,
        PARK_TIMEOUT,
        processes,
    )
    count = calls()
    snapshot = breaker.snapshot()
    return count, bool(snapshot["state"] == "open" and snapshot["opened_total"] == 1)


def test_outage_parks_every_task_and_beat_brings_all_back(
    world: tuple[dict[str, str], list[Process]], redis_client: redis.Redis
) -> None:
    env, processes = world
    worker = processes[0]
    prefix = env["E2EAPP_PREFIX"]
    keys = e2eapp.keys(prefix)
    app = e2eapp.make_app(env)
    res = Resilience(app)
    store, breaker = res.runtime.backout_store, res.breaker("dep")
    charge = app.tasks["e2eapp.charge"]
    broker_prefix = e2eapp.broker_keyprefix(prefix)

    def calls() -> int:
        return int(redis_client.get(keys["calls"]) or 0)

    def all_parked() -> bool:
        """Every id parked, once, and nothing else: one listing, as the drain may claim an entry
        for a probe between two reads."""
        entries = store.list(limit=10 * TASKS)
        found = sorted(e.task_id for e in entries)
        return found == sorted(ids) and all(e.status == "parked" for e in entries)

    redis_client.set(keys["up"], "0")
    for process in processes:
        process.start()
    for process in processes:
        process.wait_ready()

    # -- the outage: every task is parked ----------------------------------------------------
    ids = [f"{prefix}-order-{i}" for i in range(TASKS)]
    started = time.monotonic()
    with app.producer_or_acquire() as producer:
        for i, task_id in enumerate(ids):
            charge.apply_async((i,), task_id=task_id, producer=producer)
    calls_opened, before_any_probe = calls_at_first_opening(breaker, calls, processes)
    to_park = waited("every task parked", all_parked, PARK_TIMEOUT, processes)
    state_parked = breaker.state
    assert state_parked in ("open", "half_open")
    assert redis_client.scard(keys["succeeded"]) == 0

    # Still down when the breaker half-opens: beat's drain releases a probe, it fails, the
    # breaker opens again and the probe's task is parked again: nothing lost, nothing dead.
    to_failed_probe = waited(
        "a failed probe reopening the breaker",
        lambda: breaker.snapshot()["opened_total"] >= 2,
        RECOVER_TIMEOUT,
        processes,
    )
    waited("the probe's task parked again", all_parked, PARK_TIMEOUT, processes)
    assert store.count(Filter(status="dead")) == 0
    calls_down = calls()
    # The probe did call the dependency: one call more than opened the breaker.
    baseline = calls_opened if before_any_probe else e2eapp.BREAKER["failure_threshold"]
    assert calls_down > baseline

    # -- the dependency is back; nobody touches anything -------------------------------------
    redis_client.set(keys["up"], "1")
    to_close = waited(
        "the breaker closed by a probe",
        lambda: breaker.state == "closed",
        RECOVER_TIMEOUT,
        processes,
    )

    def drained() -> bool:
        return store.count() == 0 and redis_client.scard(keys["succeeded"]) == TASKS

    to_empty = to_close + waited(
        "the store empty and every task done", drained, RECOVER_TIMEOUT, processes
    )
    # Nothing left in flight (queue empty, nothing unacked), then one more look a bit later.
    waited(
        "an idle broker",
        lambda: (
            redis_client.llen(broker_prefix + env["E2EAPP_QUEUE"]) == 0
            and redis_client.hlen(broker_prefix + "unacked") == 0
        ),
        10.0,
        processes,
    )
    time.sleep(1.0)

    succeeded = {m.decode() for m in cast(set[bytes], redis_client.smembers(keys["succeeded"]))}
    assert succeeded == set(ids)
    counts = redis_client.mget([keys["count"] + i for i in ids])
    runs = {task_id: int(c or 0) for task_id, c in zip(ids, counts, strict=True)}
    not_once = {task_id: n for task_id, n in runs.items() if n != 1}
    assert not not_once, f"task ids that did not succeed exactly once: {not_once}"
    assert store.count() == 0
    snapshot = breaker.snapshot()
    assert snapshot["state"] == "closed"
    assert snapshot["closed_total"] >= 1
    drains = sum(
        "celery_resilience.drain[" in line and "succeeded" in line
        for line in worker.log().splitlines()
    )

    print(
        f"\nend-to-end timeline ({TASKS} tasks, prefork -c 2, beat drain every "
        f"{e2eapp.DRAIN_EVERY:.0f}s, open_timeout {e2eapp.BREAKER['open_timeout']:.0f}s)\n"
        f"  all parked                    {to_park:6.2f}s after publishing "
        f"(breaker {state_parked})\n"
        f"  a probe failed, reopened      {to_failed_probe:6.2f}s later (dependency down)\n"
        f"  dependency up -> closed       {to_close:6.2f}s (a probe released by beat's drain)\n"
        f"  dependency up -> store empty  {to_empty:6.2f}s (all {TASKS} succeeded)\n"
        f"  whole run                     {time.monotonic() - started:6.2f}s\n"
        f"  dependency calls: {calls_opened} until opened, {calls_down - calls_opened} probe(s) "
        f"while down, {calls() - calls_down} after; breaker opened {snapshot['opened_total']}x; "
        f"{drains} drain runs"
    )


def test_a_task_probed_again_and_again_in_a_long_outage_still_runs(
    world: tuple[dict[str, str], list[Process]], redis_client: redis.Redis
) -> None:
    """One parked task is the only probe candidate: each half-open replays it and it fails.

    ``resilience_max_replays`` is raised so that running out of replays is not the story: once
    the dependency is back, the next probe must run it and it must succeed.
    """
    env, processes = world
    env["E2EAPP_MAX_REPLAYS"] = "50"
    prefix = env["E2EAPP_PREFIX"]
    keys = e2eapp.keys(prefix)
    app = e2eapp.make_app(env)
    store = Resilience(app).runtime.backout_store
    redis_client.set(keys["up"], "0")
    for process in processes:
        process.start()
    for process in processes:
        process.wait_ready()

    task_id = f"{prefix}-lonely"
    app.tasks["e2eapp.charge"].apply_async((1,), task_id=task_id)

    def replays() -> int:
        entries = store.list()
        return entries[0].replays if entries else -1

    waited("three failed probes", lambda: replays() >= 3, RECOVER_TIMEOUT, processes)
    redis_client.set(keys["up"], "1")
    replays_at_up = replays()

    def settled() -> bool:  # it ran, or it was replayed twice more with the dependency up
        done = redis_client.sismember(keys["succeeded"], task_id)
        return bool(done) or replays() >= replays_at_up + 2

    waited("the task run, or replayed twice more", settled, RECOVER_TIMEOUT, processes)
    entries = store.list()
    assert redis_client.sismember(keys["succeeded"], task_id), [
        (e.reason, e.status, e.replays) for e in entries
    ]
