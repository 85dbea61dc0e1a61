"""A rolling upgrade: the previous release's worker (and the drains it runs) beside this one's,
on one Redis, while the dependency is down and comes back. Every order is charged once.

The previous release is the commit recorded in ``tests/upgrade/previous-release`` (its tag and
commit), its tree taken with ``git archive``; its worker runs from that tree with its own test
app (``tests.apps.upgradeapp`` copied in: its workerapp, remote control on). Beat is the test:
it sends ``celery_resilience.drain`` to the queue both workers read, so either release runs a
drain, as in a fleet half upgraded. Then the switch: ``fleet --minimum`` is refused while the
previous release's worker answers remote control (it answers ``ping``, not the version command),
recorded once it is gone, and entries are written in the new envelope from then on. Each
question waits for the workers' answers with a generous deadline: a busy worker may miss one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import cast

import pytest
import redis

from celery_resilience.backout.trust import key_id
from celery_resilience.contrib.pytest import delete_prefix
from celery_resilience.fleet import REFRESH
from tests.apps import workerapp
from tests.support.previous_release import previous_tree
from tests.support.services import REDIS_URL
from tests.support.waiting import wait_for
from tests.support.worker_process import ROOT, WorkerProcess, spawn

pytestmark = pytest.mark.integration

#: Orders placed while both releases run (a few more than one drain batch).
ORDERS = 60


class PreviousWorker(WorkerProcess):
    """A worker of the previous release: run from its own tree, which it imports first."""

    def __init__(
        self, tree: Path, env: dict[str, str], log: Path, pool: str, concurrency: int, app: str
    ) -> None:
        super().__init__(env, log, pool, concurrency, app)
        self.tree = tree

    def start(self, timeout: float = 60.0) -> WorkerProcess:
        command = self.command()
        self.process = spawn(command, {**self.env, "PYTHONPATH": str(self.tree)}, self.log_path)
        self.wait_ready(timeout)
        return self

    def command(self) -> list[str]:
        return ["sh", "-c", f'cd "{self.tree}" && exec "$0" "$@"', *super().command()]


@pytest.fixture
def env(key_prefix: str) -> dict[str, str]:
    return {
        "WORKERAPP_PREFIX": key_prefix,
        "WORKERAPP_QUEUE": f"{key_prefix}-queue",
        "WORKERAPP_REDIS": REDIS_URL,
        "WORKERAPP_BROKER": REDIS_URL,
        "WORKERAPP_FAILURE_THRESHOLD": "3",
        "WORKERAPP_OPEN_TIMEOUT": "1",
        "WORKERAPP_MAX_RETRIES": "1",
        "WORKERAPP_BACKOFF_BASE": "0.05",
        "WORKERAPP_BACKOFF_CAP": "0.1",
        "WORKERAPP_SIGNING_KEY": "upgrade-signing-key-" + "u" * 20,
    }


def fleet(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``celery -A tests.apps.upgradeapp resilience fleet <args>`` of this release."""
    command = [sys.executable, "-m", "celery", "-A", "tests.apps.upgradeapp", "resilience"]
    return subprocess.run(
        [*command, "fleet", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


class Ledger:
    """The orders of one run, the dependency they call and where each ended."""

    def __init__(self, env: dict[str, str], client: redis.Redis) -> None:
        self.app = workerapp.make_app(env)
        self.client = client
        self.prefix = env["WORKERAPP_PREFIX"]
        self.orders: list[str] = []

    def outage(self, orders: int, tag: str, parked: int) -> None:
        """The dependency answers 503s while ``orders`` are placed, until ``parked`` entries."""
        self.client.set(f"{self.prefix}:dep:up", "0")
        self.orders += [
            self.app.send_task("workerapp.charge", args=[f"{tag}-{n}"]).id for n in range(orders)
        ]
        entries = f"{{{self.prefix}:backout}}:entries"
        wait_for(lambda: self.client.hlen(entries) >= parked, f"{tag} orders to park", 60)
        self.client.set(f"{self.prefix}:dep:up", "1")

    def charged(self) -> bool:
        """Whether every order was charged, after a beat tick: a drain sent to either worker."""
        self.app.send_task("celery_resilience.drain")
        time.sleep(0.5)
        members = cast(set[bytes], self.client.smembers(f"{self.prefix}:ledger:succeeded"))
        return {m.decode() for m in members} >= set(self.orders)

    def check(self) -> None:
        """0 lost (every order charged), 0 twice, nothing dead."""
        wait_for(self.charged, "every order to be charged", 90, poll=0.0)
        raw = cast(dict[bytes, bytes], self.client.hgetall(f"{self.prefix}:ledger:runs"))
        twice = {k.decode(): int(v) for k, v in raw.items() if int(v) != 1}
        assert twice == {}, "charged twice"
        raw = cast(dict[bytes, bytes], self.client.hgetall(f"{{{self.prefix}:backout}}:counts"))
        assert {k: v for k, v in raw.items() if k.startswith(b"dead|") and int(v)} == {}

    def envelopes(self) -> set[bytes]:
        payloads = cast(list[bytes], self.client.hvals(f"{{{self.prefix}:backout}}:entries"))
        return {p.partition(b";")[0] for p in payloads}


def test_the_previous_releases_worker_and_drain_beside_this_ones_charge_every_order_once(
    env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    tree = previous_tree(tmp_path)
    assert not (tree / "celery_resilience" / "fleet.py").exists()  # the previous release's code
    ledger = Ledger(env, redis_client)
    app = "tests.apps.upgradeapp"
    previous = PreviousWorker(tree, env, tmp_path / "previous.log", "prefork", 2, app)
    this = WorkerProcess(env, tmp_path / "this.log", "prefork", 2, app)
    try:
        previous.start(60.0)
        this.start(60.0)
        ledger.outage(ORDERS, "mixed", ORDERS - 3)  # the 3 failures that opened it ran
        assert ledger.envelopes() == {b"2"}  # what the previous release reads
        ledger.check()
        assert "celery_resilience.drain" in previous.log(), "the previous release drained"
        assert "celery_resilience.drain" in this.log(), "this release drained"

        # Without --yes nothing is ever recorded (no terminal to ask on): asked until the
        # previous release's worker is among the answers, and named as older.
        older = previous.hostname.split("@")[0]
        refused = wait_for(
            lambda: (
                (done := fleet(env, "--minimum", "0.4")).returncode == 1
                and older in done.stderr
                and done
            ),
            "the previous release's worker to answer and be refused as older",
            180,
            poll=0.0,
        )
        assert "version below 0.4" in refused.stderr, refused
        previous.stop()
        recorded = wait_for(
            lambda: (
                (done := fleet(env, "--minimum", "0.4", "--yes", "--json")).returncode == 0 and done
            ),
            "this release's worker to answer, and the minimum to be recorded",
            180,
            poll=0.0,
        )
        said = json.loads(recorded.stdout)
        assert (said["minimum"], said["envelope"]) == ("0.4", 3)
        assert [w["version"] for w in said["workers"].values()] == ["0.4"]
        (answer,) = said["workers"].values()  # the key's id, never the key (nor "***")
        assert answer["key_ids"]["signing"] == [key_id(env["WORKERAPP_SIGNING_KEY"].encode())]
        time.sleep(REFRESH)  # the running worker reads the minimum again
        ledger.outage(10, "late", 8)
        assert ledger.envelopes() == {b"3"}
        ledger.check()
    finally:
        previous.stop()
        this.stop()
        delete_prefix(redis_client, env["WORKERAPP_PREFIX"])
        ledger.app.close()
