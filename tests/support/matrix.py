"""The world of the fault matrix: a real worker, a private broker and a private resilience Redis
that the tests break on purpose, and a ledger kept where no fault reaches it.

- The **broker** is a ``redis-server`` of the test's own (AOF on: a killed broker keeps its
  queues). Workers and drainers log in as the ACL user ``worker``, which a cell can forbid to
  publish (``-lpush``: NOPERM); the test publishes as the default user.
- The **resilience Redis** (breakers, back-out store) is another private ``redis-server`` (AOF
  on), reached by workers and drainers through a :class:`~tests.support.faults.FaultProxy` and
  as the ACL user ``worker``: a cell can hang it, cut it, hold a client at one script, or make it
  answer NOPERM, OOM or READONLY. The test reads it directly, as the default user.
- The **ledger** lives in the suite's own Redis (``127.0.0.1:6379/15``, under the cell's key
  prefix): the fake dependency, the bodies that succeeded (``runs``: task id -> count) and the
  result backend.

A cell publishes known task ids, applies a fault at one step, heals it, brings everything home
(dependency up, breaker reset, parked entries replayed, no message of its ids left in the broker)
and checks its :class:`Ledger`: every id succeeded exactly once, or is dead in the store with a
reason, or failed in its own code. An id found nowhere fails the cell, naming it.

Duplicates are counted, not hidden: ``charge`` runs without ``deduplicate`` (``charge_once``
has it), the ledger counts the bodies run per id, the store's entries per id (a double park
shows as two), and the messages published per id as the broker saw them
(:class:`~tests.support.broker_tap.BrokerTap`).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import redis
from celery import Celery

from celery_resilience import Resilience
from celery_resilience.backout.entry import ParkedTask
from celery_resilience.contrib.pytest import delete_prefix
from tests.apps.workerapp import broker_keyprefix, make_app

from .broker_tap import BrokerTap
from .faults import FaultProxy, make_user
from .redis_server import RedisServer
from .waiting import wait_for
from .worker_process import WorkerProcess, force_open_for_workers

ROOT = Path(__file__).resolve().parents[2]
USER, PASSWORD = "worker", "worker-secret"
#: Seconds a cell waits for the world to reach what it expects: a deadline, not a pause (a cell
#: goes on as soon as it holds), far above the few seconds it needs on a quiet host.
SETTLE_TIMEOUT = 90.0
#: Ledger rows of every cell run in this session, printed at its end (and for the docs).
TABLE: list[dict[str, Any]] = []
#: Where to write the rows as JSON lines, when set.
TABLE_ENV = "RESILIENCE_MATRIX_TABLE"


@dataclass
class Ledger:
    """Where each published id of one cell ended."""

    cell: str
    published: list[str]
    runs: dict[str, int]
    entries: dict[str, ParkedTask]
    failed: set[str]
    during: dict[str, int] = field(default_factory=dict)
    #: Task id -> entries in the store (``entries`` keeps one of them).
    stored: dict[str, int] = field(default_factory=dict)
    #: Task id -> messages published for it (the test's own, retries, kept copies, replays).
    messages: dict[str, int] = field(default_factory=dict)

    @property
    def succeeded(self) -> set[str]:
        return {t for t in self.published if self.runs.get(t, 0) >= 1}

    @property
    def duplicated(self) -> set[str]:
        return {t for t in self.published if self.runs.get(t, 0) > 1}

    @property
    def parked_twice(self) -> set[str]:
        return {t for t in self.published if self.stored.get(t, 0) > 1}

    def with_status(self, status: str) -> set[str]:
        return {t for t, e in self.entries.items() if e.status == status and t in self.published}

    @property
    def own_failures(self) -> set[str]:
        """FAILURE raised by the task's own code (a dead entry's result reads FAILURE too: the
        drain fails it so that its workflow does not wait forever)."""
        return self.failed - self.with_status("dead")

    @property
    def lost(self) -> set[str]:
        found = self.succeeded | set(self.entries) | self.failed
        return set(self.published) - found

    def row(self) -> dict[str, Any]:
        return {
            "cell": self.cell,
            "published": len(self.published),
            "succeeded": len(self.succeeded),
            "duplicated": len(self.duplicated),
            "parked_twice": len(self.parked_twice),
            "messages": sum(self.messages.get(t, 0) for t in self.published),
            "parked": len(self.with_status("parked")),
            "dead": len(self.with_status("dead")),
            "failure": len(self.own_failures),
            "lost": len(self.lost),
            **{f"during_{k}": v for k, v in self.during.items()},
        }

    def check(
        self,
        *,
        dead: int = 0,
        failed: int = 0,
        duplicates: int = 0,
        messages: dict[str, int] | None = None,
    ) -> None:
        """No id lost, none both succeeded and stored, none parked twice; the expected dead,
        failed and duplicated (run twice) counts, and messages per id where given."""
        TABLE.append(self.row())
        print(f"ledger {self.row()}")
        if os.environ.get(TABLE_ENV):  # the matrix as a table, for the docs
            with open(os.environ[TABLE_ENV], "a") as out:
                out.write(json.dumps(self.row()) + "\n")
        assert not self.lost, f"{self.cell}: lost {sorted(self.lost)}"
        both = self.succeeded & set(self.entries)
        assert not both, f"{self.cell}: succeeded and still stored: {sorted(both)}"
        assert len(self.with_status("dead")) == dead, (self.cell, self.entries)
        assert len(self.own_failures) == failed, (self.cell, self.own_failures)
        assert len(self.duplicated) == duplicates, (self.cell, self.duplicated, self.runs)
        assert not self.parked_twice, (self.cell, self.stored)
        assert not self.during.get("parked_twice"), (self.cell, self.during)
        if messages is not None:
            seen = {t: self.messages.get(t, 0) for t in self.published}
            assert seen == {t: messages.get(t, 1) for t in self.published}, (self.cell, seen)
        assert not self.with_status("parked"), f"{self.cell}: still parked"


class MatrixWorld:
    """One matrix module's servers, proxies, worker and apps (see the module docstring)."""

    def __init__(self, tmp_path: Path, ledger_url: str, **settings: Any) -> None:
        self.tmp_path = tmp_path
        self.prefix = f"matrix-{uuid.uuid4().hex[:10]}"
        self.queue = f"{self.prefix}-queue"
        self.broker = RedisServer(appendonly=True).start()
        self.store = RedisServer(appendonly=True).start()
        self.broker_admin = self.broker.client()
        self.store_admin = self.store.client()
        broker = broker_keyprefix(self.prefix)
        self.tap = BrokerTap(self.broker.client(), broker + self.queue, broker + "unacked")
        for admin in (self.broker_admin, self.store_admin):
            make_user(admin, USER, PASSWORD)
        self.broker_proxy = FaultProxy(self.broker.port)
        self.store_proxy = FaultProxy(self.store.port)
        self.ledger_url = ledger_url
        self.ledger = redis.Redis.from_url(ledger_url)
        common = {
            "WORKERAPP_PREFIX": self.prefix,
            "WORKERAPP_QUEUE": self.queue,
            "WORKERAPP_LEDGER": ledger_url,
            "WORKERAPP_DEDUPLICATE": "0",
            # charge_once: a child killed mid-body holds its task id's claim until this lease
            # ends (seconds).
            "WORKERAPP_DEDUP_LEASE": "5",
            "WORKERAPP_KEEP_DELAY": "0.5",
            "WORKERAPP_REDIS_TIMEOUT": "0.5",
            "WORKERAPP_FAILURE_THRESHOLD": "3",
            "WORKERAPP_OPEN_TIMEOUT": "600",
            "WORKERAPP_MAX_RETRIES": "1",
            "WORKERAPP_BACKOFF_BASE": "0.05",
            "WORKERAPP_BACKOFF_CAP": "0.2",
            "WORKERAPP_JITTER": "none",
            "WORKERAPP_PREFETCH_MULTIPLIER": "1",
            "WORKERAPP_VISIBILITY_TIMEOUT": "20",
        }
        common.update({f"WORKERAPP_{k.upper()}": str(v) for k, v in settings.items()})
        creds = f"{USER}:{PASSWORD}@"
        #: What workers and drainers use: the ACL user, through the proxies.
        self.env = {
            **common,
            "WORKERAPP_BROKER": f"redis://{creds}{self.broker_proxy.url}/0",
            "WORKERAPP_REDIS": f"redis://{creds}{self.store_proxy.url}/0",
        }
        #: What the test itself uses: the default user, straight to the servers.
        self.admin_env = {
            **common,
            "WORKERAPP_BROKER": self.broker.url,
            "WORKERAPP_REDIS": self.store.url,
        }
        self.app: Celery = make_app(self.admin_env)
        self.resilience = Resilience.for_app(self.app)
        self.resilience.runtime.send_events = False
        self.workers: list[WorkerProcess] = []

    # -- processes -------------------------------------------------------------------------
    def start_worker(self, pool: str = "prefork", concurrency: int = 1) -> WorkerProcess:
        log = self.tmp_path / f"matrix-worker-{len(self.workers)}.log"
        worker = WorkerProcess(self.env, log, pool=pool, concurrency=concurrency)
        self.workers.append(worker)
        return worker.start()

    @property
    def worker(self) -> WorkerProcess:
        return self.workers[-1]

    def drainer_app(self) -> Resilience:
        """A drain that goes through the proxies as the ACL user, as a beat-run one would."""
        app = make_app(self.env)
        resilience = Resilience(app)
        resilience.runtime.send_events = False
        return resilience

    def start_drainer(self, lease: float = 2.0) -> subprocess.Popen[bytes]:
        """``Drainer(lease=...).run()`` in a process of its own (to be killed with -9)."""
        code = (
            "import os; from tests.apps.workerapp import make_app; "
            "from celery_resilience.drain import Drainer; "
            "from celery_resilience.runtime import Runtime; "
            f"print(Drainer(Runtime(make_app(os.environ)), lease={lease}).run(), flush=True)"
        )
        log = open(self.tmp_path / "drainer.log", "ab")  # noqa: SIM115 - closed with the process
        return subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env={**os.environ, **self.env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    # -- tasks -------------------------------------------------------------------------------
    def force_open(self, breaker: str = "dep") -> None:
        force_open_for_workers(self.resilience.breaker(breaker))

    def publish(self, count: int, tag: str, task: str = "charge", **options: Any) -> list[str]:
        ids = []
        for i in range(count):
            task_id = f"{tag}-{i}-{uuid.uuid4().hex[:6]}"
            self.app.tasks[f"workerapp.{task}"].apply_async(
                (f"{tag}-{i}",), task_id=task_id, **options
            )
            ids.append(task_id)
        return ids

    def dependency(self, up: bool) -> None:
        self.ledger.set(f"{self.prefix}:dep:up", "1" if up else "0")

    def runs(self) -> dict[str, int]:
        raw = cast(dict[bytes, bytes], self.ledger.hgetall(f"{self.prefix}:ledger:runs"))
        return {k.decode(): int(v) for k, v in raw.items()}

    def entries(self) -> dict[str, ParkedTask]:
        return {e.task_id: e for e in self.resilience.backout.list(limit=100_000)}

    def stored(self) -> dict[str, int]:
        """Task id -> entries the store holds for it (more than one: parked twice)."""
        return dict(Counter(e.task_id for e in self.resilience.backout.list(limit=100_000)))

    def failed(self, ids: Iterable[str]) -> set[str]:
        return {t for t in ids if self.app.AsyncResult(t).state == "FAILURE"}

    def in_broker(self, ids: Iterable[str]) -> set[str]:
        """Ids with a message in the broker (queued, or held unacked by a worker)."""
        raw = []
        for key in self.broker_admin.scan_iter(match=f"{broker_keyprefix(self.prefix)}*"):
            kind = self.broker_admin.type(key)
            if kind == b"list":
                raw += self.broker_admin.lrange(key, 0, -1)
            elif kind == b"hash":
                raw += self.broker_admin.hvals(key)
        return {t for t in ids if any(t.encode() in m for m in raw)}

    def snapshot(self, ids: list[str]) -> dict[str, int]:
        """Where the ids are while the fault lasts (before anything is healed)."""
        stored, runs = self.stored(), self.runs()
        return {
            "succeeded": sum(1 for t in ids if runs.get(t)),
            "parked": sum(1 for t in ids if t in stored),
            "parked_twice": sum(1 for t in ids if stored.get(t, 0) > 1),
            "in_broker": len(self.in_broker(ids)),
        }

    # -- bringing everything home ------------------------------------------------------------
    def settle(self, cell: str, ids: list[str], during: dict[str, int] | None = None) -> Ledger:
        """Dependency up, breaker reset, every parked entry of ``ids`` replayed; then wait until
        each id succeeded, is dead, or failed in its own code."""
        self.dependency(up=True)
        self.resilience.breaker("dep").reset()

        def home() -> bool:
            entries = self.entries()
            for task_id, entry in entries.items():
                if task_id in ids and entry.status == "parked":
                    with contextlib.suppress(KeyError, ValueError, TimeoutError):
                        self.resilience.backout.replay(entry.id)
            runs, entries = self.runs(), self.entries()
            open_ids = [
                t
                for t in ids
                if not (runs.get(t) and t not in entries)
                and not (t in entries and entries[t].status == "dead")
            ]
            return not open_ids or not (set(open_ids) - self.failed(open_ids))

        wait_for(home, f"{cell}: every id to succeed, die or fail", SETTLE_TIMEOUT)
        return self.ledger_of(cell, ids, during or {})

    def ledger_of(self, cell: str, ids: list[str], during: dict[str, int]) -> Ledger:
        """The ledger once every message of ``ids`` was acked and none is left in the broker:
        a duplicate (a second message, one restored after the visibility timeout) has run by
        then."""
        wait_for(
            lambda: not self.tap.pending(ids) and not self.in_broker(ids),
            f"{cell}: every message acked, none left in the broker",
            SETTLE_TIMEOUT,
        )
        return Ledger(
            cell,
            ids,
            self.runs(),
            self.entries(),
            self.failed(ids),
            during,
            self.stored(),
            self.tap.messages(ids),
        )

    def heal(self) -> None:
        self.store_proxy.release()
        self.broker_proxy.release()
        for admin in (self.broker_admin, self.store_admin):
            make_user(admin, USER, PASSWORD)

    def close(self) -> None:
        for worker in self.workers:
            print(f"===== {worker.log_path.name}\n{worker.stop()}")
        self.store_proxy.close()
        self.broker_proxy.close()
        self.app.close()
        self.tap.close()
        for client in (self.broker_admin, self.store_admin):
            client.close()
        self.broker.close()
        self.store.close()
        delete_prefix(self.ledger, self.prefix)
        self.ledger.close()


@contextlib.contextmanager
def running_world(
    tmp: Path, redis_url: str, pool: str, concurrency: int = 1, **options: Any
) -> Iterator[MatrixWorld]:
    """A world with one worker started (a test module's fixture); its ledger rows are printed
    at the end."""
    world = MatrixWorld(tmp, redis_url, **options)
    try:
        world.start_worker(pool, concurrency)
        yield world
    finally:
        world.close()
        for row in TABLE:
            print(row)


def fresh(world: MatrixWorld) -> None:
    """Every cell starts healed, with the dependency up and a fresh closed breaker."""
    world.heal()
    world.dependency(up=True)
    world.resilience.breaker("dep").reset()
