"""A fleet of real processes sharing one breaker: each a separate interpreter (multiprocessing
"spawn") with its own Redis connections and its own ``Breaker``, as prefork children on
different hosts would be. ``started`` (a fixture of the whole suite: ``conftest.py`` loads this
module as a plugin) SIGKILLs by PID whatever a test started and left running.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Iterator
from multiprocessing.process import BaseProcess
from typing import Any

import pytest
import redis
from celery import Celery

from celery_resilience import Resilience

SPAWN = multiprocessing.get_context("spawn")
#: Generous timeouts: a slow spawn or a busy 2-core machine must not break a barrier.
BARRIER_TIMEOUT = 60.0
JOIN_TIMEOUT = 30.0


def fleet_resilience(redis_url: str, prefix: str, options: dict[str, Any]) -> Resilience:
    """One process's ``Resilience`` of a fleet sharing breaker ``dep`` (``options``) under
    ``prefix``: made in each spawned process, so no fixture."""
    app = Celery("t", broker=redis_url, set_as_current=False)
    app.conf.resilience_redis_url = redis_url
    app.conf.resilience_key_prefix = prefix
    # The default 0.5 s is tight for 16 processes on 2 cores; these tests are about atomicity,
    # not about Redis timeouts (a timed-out script is re-sent by redis-py's retry).
    app.conf.resilience_redis_timeout = 5.0
    app.conf.resilience_breakers = {"dep": options}
    return Resilience(app)


def redis_time_us(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return seconds * 1_000_000 + micros


def stop(processes: list[BaseProcess]) -> None:
    """Kill, by PID, whichever of our own processes is still running."""
    for process in processes:
        if process.pid is not None and process.is_alive():
            os.kill(process.pid, signal.SIGKILL)
        process.join(JOIN_TIMEOUT)


@pytest.fixture
def started() -> Iterator[list[BaseProcess]]:
    """Processes a test starts; any left alive are SIGKILLed by PID at teardown."""
    processes: list[BaseProcess] = []
    yield processes
    stop(processes)


def start(started: list[BaseProcess], target: Any, *args: Any) -> BaseProcess:
    process = SPAWN.Process(target=target, args=args, daemon=True)
    process.start()
    started.append(process)
    return process


def join_all(processes: list[BaseProcess]) -> None:
    for process in processes:
        process.join(JOIN_TIMEOUT)
    assert [p.exitcode for p in processes] == [0] * len(processes)
