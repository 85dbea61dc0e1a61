"""One world of the Sentinel and Cluster tests: a real worker of ``tests.apps.deployapp`` whose
breakers and parked tasks live on the deployment under test, and the surfaces a person uses on
it (the CLI, the metrics collector, the Django admin).

The broker, the results and the ledger stay on the suite's plain Redis (``REDIS_URL``), under
the world's prefix, so that a failover of the deployment touches nothing but what is tested.
The ledger: ``<P>:ledger:succeeded`` (task ids whose body succeeded) and ``<P>:ledger:runs``
(task id -> bodies run); with the store, every published task id must end in one of the two.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from celery import Celery

from celery_resilience import Resilience
from celery_resilience.backout import Filter
from celery_resilience.contrib.pytest import delete_prefix
from celery_resilience.metrics import ResilienceCollector
from tests.apps import deployapp
from tests.apps.workerapp import broker_keyprefix
from tests.support import cli_forks
from tests.support.redis_server import REDIS_SERVER
from tests.support.services import REDIS_URL, service_missing
from tests.support.worker_process import WorkerProcess

CLI_TIMEOUT = 180.0
#: One scrape of the metrics collector: ``{(sample name, labels): value}``.
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def require_redis_7() -> None:
    """Skip where Debian's Redis 7 is missing (its sentinel and cluster tools); fail in CI."""
    if Path(REDIS_SERVER).is_absolute():
        return
    service_missing("Debian's redis-server (Redis 7) is not installed at /usr/bin/redis-server")


def world_env(prefix: str, redis_url: str, **extra: str) -> dict[str, str]:
    """The ``WORKERAPP_*``/``DEPLOYAPP_*`` variables of a world on ``redis_url``."""
    return {
        "WORKERAPP_PREFIX": prefix,
        "WORKERAPP_QUEUE": f"{prefix}-queue",
        "WORKERAPP_REDIS": redis_url,
        "WORKERAPP_BROKER": REDIS_URL,
        "WORKERAPP_LEDGER": REDIS_URL,
        "WORKERAPP_FAILURE_THRESHOLD": "3",
        "WORKERAPP_OPEN_TIMEOUT": "60",
        "WORKERAPP_MAX_RETRIES": "2",
        "WORKERAPP_BACKOFF_BASE": "0.05",
        "WORKERAPP_BACKOFF_CAP": "0.2",
        "WORKERAPP_KEEP_DELAY": "0.5",
        "WORKERAPP_REDIS_TIMEOUT": "0.5",
        **extra,
    }


@dataclass
class World:
    env: dict[str, str]
    log: Path
    app: Celery = field(init=False)
    res: Resilience = field(init=False)
    ledger: redis.Redis = field(init=False)
    worker: WorkerProcess | None = None

    def __post_init__(self) -> None:
        self.app = deployapp.make_app(self.env)
        self.res = Resilience.install(self.app, Resilience(self.app))
        self.ledger = redis.Redis.from_url(REDIS_URL)

    @property
    def prefix(self) -> str:
        return self.env["WORKERAPP_PREFIX"]

    def start_worker(self) -> WorkerProcess:
        self.worker = WorkerProcess(self.env, self.log, app="tests.apps.deployapp").start()
        return self.worker

    def close(self) -> str:
        log = self.worker.stop() if self.worker is not None else ""
        self.res.runtime.close()
        delete_prefix(self.ledger, self.prefix)  # broker, results and ledger of this world
        self.ledger.close()
        return log

    # -- the dependencies and the ledger ------------------------------------------------------
    def set_dependency(self, up: bool, breaker: str = "dep") -> None:
        scope = self.prefix if breaker == "dep" else f"{self.prefix}:{breaker}"
        self.ledger.set(f"{scope}:dep:up", "1" if up else "0")

    def publish(self, task: str, n: int, tag: str) -> list[str]:
        return [self.app.send_task(task, args=[f"{tag}-{i}"]).id for i in range(n)]

    def succeeded(self) -> set[str]:
        members = cast(set[bytes], self.ledger.smembers(f"{self.prefix}:ledger:succeeded"))
        return {m.decode() for m in members}

    def runs(self) -> dict[str, int]:
        raw = cast(dict[bytes, bytes], self.ledger.hgetall(f"{self.prefix}:ledger:runs"))
        return {k.decode(): int(v) for k, v in raw.items()}

    def meta_key(self, task_id: str) -> bytes:
        """The task's key in the result backend, as the backend spells it: Celery before 5.5
        joins ``global_keyprefix`` to ``celery-task-meta-`` with an underscore, later ones do
        not."""
        return bytes(self.app.backend.get_key_for_task(task_id))

    def acked_parks(self, task_ids: list[str]) -> dict[str, str]:
        """Task id -> entry id of each task whose park was acknowledged: the worker writes
        state ``PARKED`` (with the entry's id) to the result backend only once the store took
        the entry, just before the message is acked."""
        keys = [self.meta_key(t) for t in task_ids]
        acked = {}
        for task_id, raw in zip(task_ids, self.ledger.mget(keys) if keys else [], strict=True):
            meta = json.loads(raw) if raw else {}
            if meta.get("status") == "PARKED":
                acked[task_id] = meta["result"]["entry_id"]
        return acked

    def whereabouts(self, task_ids: list[str]) -> dict[str, dict[str, Any]]:
        """Where each of ``task_ids`` is (for a test's failure message): its messages in the
        broker (``queued`` or held ``unacked`` by a worker, with their ETA and retries), its
        state in the result backend, the bodies that ran, and the worker's log lines naming it."""
        broker = broker_keyprefix(self.prefix)
        queued = self.ledger.lrange(f"{broker}{self.env['WORKERAPP_QUEUE']}", 0, -1)
        unacked = self.ledger.hvals(f"{broker}unacked")
        runs, log = self.runs(), self.worker.log() if self.worker is not None else ""
        found: dict[str, dict[str, Any]] = {}
        for task_id in task_ids:
            meta = self.ledger.get(self.meta_key(task_id))
            found[task_id] = {
                "queued": [_headers(m) for m in queued if task_id.encode() in m],
                "unacked": [_headers(json.loads(m)[0]) for m in unacked if task_id.encode() in m],
                "state": json.loads(meta)["status"] if meta else None,
                "runs": runs.get(task_id, 0),
                "log": [line for line in log.splitlines() if task_id in line][-6:],
            }
        return found

    def parked_task_ids(self, breaker: str | None = None) -> list[str]:
        """Task ids of the store's entries (one per entry: a task parked twice shows twice)."""
        store = self.res.runtime.backout_store
        return [e.task_id for e in store.list(Filter(breaker=breaker), limit=100_000)]

    # -- the surfaces --------------------------------------------------------------------------
    def cli(
        self, *commands: tuple[str, ...], check: bool = True
    ) -> list[subprocess.CompletedProcess[str]]:
        """``celery -A tests.apps.deployapp resilience <args>`` for each command, side by side;
        each must exit 0 unless ``check`` is false."""
        started = [
            cli_forks.celery(["-A", "tests.apps.deployapp", "resilience", *args], self.env)
            for args in commands
        ]
        done = []
        for args, process in zip(commands, started, strict=True):
            stdout, stderr = process.communicate(timeout=CLI_TIMEOUT)
            result = subprocess.CompletedProcess(list(args), process.returncode, stdout, stderr)
            if check:
                assert result.returncode == 0, f"resilience {' '.join(args)}:\n{stdout}\n{stderr}"
            done.append(result)
        return done

    def cli_json(self, *commands: tuple[str, ...]) -> list[Any]:
        return [json.loads(r.stdout) for r in self.cli(*((*c, "--json") for c in commands))]

    def metrics(self) -> Samples:
        """One scrape of the collector: ``{(sample name, labels): value}``."""
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for family in ResilienceCollector(self.res).collect()
            for s in family.samples
        }

    def admin_store_page(self, config: pytest.Config, module: Any) -> str:
        """The Django admin's list of the configured store, as a superuser sees it (the app is
        found through ``CELERY_RESILIENCE_APP = "<module>:APP"``)."""
        from tests.support import django_settings

        django_settings.ensure_test_database("default", config)
        from django.contrib.auth.models import User
        from django.test import Client, override_settings

        module.APP = self.app
        user = User.objects.create_superuser(f"boss-{self.prefix}", "boss@example.com", "pw")
        try:
            client = Client()
            client.force_login(user)
            with override_settings(CELERY_RESILIENCE_APP=f"{module.__name__}:APP"):
                response = client.get("/admin/celery_resilience/storeentry/")
            assert response.status_code == 200, response.status_code
            return str(response.content.decode())
        finally:
            user.delete()


def _headers(message: Any) -> dict[str, Any]:
    """The headers of a kombu message (raw JSON or decoded) that say when and how often."""
    raw = json.loads(message) if isinstance(message, bytes) else message
    headers = raw.get("headers", {})
    return {k: headers.get(k) for k in ("eta", "retries")} | {
        "redelivered": raw.get("properties", {}).get("delivery_info", {}).get("redelivered")
        or headers.get("redelivered")
    }


def metric(samples: Samples, name: str, **labels: str) -> float | None:
    """The value of ``celery_resilience_<name>{labels}`` in one scrape, if there."""
    return samples.get((f"celery_resilience_{name}", frozenset(labels.items())))
