"""The ``celery resilience`` command as the tests run it: real processes of ``celery -A
tests.apps.cliapp resilience ...`` against one test's app, its ``Resilience`` and its store
(forked from a process that imported Celery's command line once: ``cli_forks``).

``cli`` is a fixture of the whole suite (``conftest.py`` loads this module as a plugin).
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from celery_resilience import ParkedTask, Resilience
from celery_resilience.backout import Filter
from tests.apps import cliapp

from . import cli_forks
from .cli_forks import Forked

CLI_TIMEOUT = 180.0


@dataclass
class Result:
    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)

    def __str__(self) -> str:
        return (
            f"celery resilience {' '.join(self.args)} -> {self.returncode}\n"
            f"--- stdout\n{self.stdout}--- stderr\n{self.stderr}"
        )


class Cli:
    """One test's world: the app, its ``Resilience``, and the command run against it."""

    def __init__(self, env: dict[str, str], client: redis.Redis) -> None:
        self.env = env
        self.client = client
        self.app = cliapp.make_app(env)
        self.res = Resilience(self.app)
        self.store = self.res.runtime.backout_store
        self.queue_key = cliapp.broker_keyprefix(env["CLIAPP_PREFIX"]) + env["CLIAPP_QUEUE"]

    def _start(self, args: tuple[str, ...]) -> subprocess.Popen[str] | Forked:
        return cli_forks.celery(["-A", "tests.apps.cliapp", "resilience", *args], self.env)

    def many(self, *commands: tuple[str, ...]) -> list[Result]:
        """Run the commands side by side (they must not depend on each other)."""
        started = [(args, self._start(args)) for args in commands]
        results = []
        for args, process in started:
            try:
                stdout, stderr = process.communicate(timeout=CLI_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                stdout, stderr = process.communicate()
                pytest.fail(f"celery resilience {' '.join(args)} hung:\n{stdout}\n{stderr}")
            results.append(Result(args, process.returncode, stdout, stderr))
        return results

    def __call__(self, *args: str, rc: int | None = 0) -> Result:
        (result,) = self.many(args)
        if rc is not None:
            assert result.returncode == rc, str(result)
        return result

    # -- the world as the test sees it -------------------------------------------------------
    def park(
        self,
        n: int,
        *,
        task_name: str = "cliapp.charge",
        breaker: str | None = "payments",
        reason: str = "breaker_open",
        status: str = "parked",
        exc: BaseException | None = None,
        **fields: Any,
    ) -> ParkedTask:
        """Park entry number ``n``: parked ``n`` seconds after a fixed past time (newer = more)."""
        values: dict[str, Any] = {
            "task_name": task_name,
            "task_id": f"{self.env['CLIAPP_PREFIX']}-task-{n}",
            "args": [f"order-{n}"],
            "kwargs": {"amount": n, "note": "naïve ☃"},
            "breaker": breaker,
            "reason": reason,
            "status": status,
            "parked_at": time.time() - 1000 + n,
            "exc": exc,
        }
        if status == "dead":
            values["dead_reason"] = "max_replays"
        values.update(fields)
        entry = ParkedTask.new(**values)
        self.store.park(entry)
        return entry

    def published(self) -> list[dict[str, Any]]:
        """Headers of the messages in the app's queue (the Redis broker's list), oldest first."""
        raw = self.client.lrange(self.queue_key, 0, -1)
        messages = [json.loads(m) for m in reversed(raw)]  # kombu LPUSHes, workers BRPOP
        for message in messages:
            body = message["body"]
            if message["properties"].get("body_encoding") == "base64":
                body = base64.b64decode(body)
            message["headers"]["_body"] = json.loads(body)
        return [m["headers"] for m in messages]

    def ids(self, **filters: Any) -> list[str]:
        return [e.id for e in self.store.list(Filter(**filters), limit=10_000)]


@pytest.fixture
def cli(key_prefix: str, redis_url: str, redis_client: redis.Redis) -> Iterator[Cli]:
    env = {
        "CLIAPP_PREFIX": key_prefix,
        "CLIAPP_BROKER": redis_url,
        "CLIAPP_QUEUE": f"{key_prefix}-queue",
    }
    world = Cli(env, redis_client)
    yield world
    world.res.runtime.close()
