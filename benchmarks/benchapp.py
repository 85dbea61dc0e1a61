"""Celery app of the throughput benchmark's worker subprocesses (driven by ``throughput.py``).

Configured from the environment, which ``throughput.py`` sets before it imports this module or
starts ``celery -A benchmarks.benchapp worker``:

==================  ========================================================================
BENCH_BROKER_URL    broker (Redis); the timing records are written there too
BENCH_REDIS_URL     Redis of the resilience breaker and of pybreaker's storage
BENCH_QUEUE         the run's own queue
BENCH_PREFIX        the run's own key prefix (resilience ``key_prefix``, pybreaker namespace)
BENCH_STATS_KEY     hash the worker processes write their timing records to
BENCH_TOTAL         messages published for this worker (warm-up included), numbered 0..N-1
BENCH_WARMUP        the first messages (by number) that are run but not timed
==================  ========================================================================

Three no-op tasks, one per variant: ``bench.plain`` (``@app.task``), ``bench.resilient``
(``ResilientTask`` with the closed breaker ``bench``: the default success path) and
``bench.pybreaker`` (a plain task calling a no-op through ``pybreaker.CircuitBreaker`` kept in
Redis by ``CircuitRedisStorage``, one breaker per worker process).

Timing, the same for every variant: ``task_prerun`` / ``task_postrun`` handlers count tasks in
the memory of each worker process and note the start of its first timed task and the end of its
last one (wall clock, comparable across the processes of one host). A process writes its record
with one ``HSET`` every ``EVERY`` tasks and on each of the last ``TAIL`` messages, so the
benchmark sees the final counts without a Redis round trip per task, and once more at shutdown.

Round trips: in a worker (``BENCH_STATS_KEY`` set) redis-py's ``send_packed_command`` is wrapped
to count, per process, the requests written to any Redis (a pipeline is one): the record carries
the count, so the benchmark gets client round trips per task that other clients of the same
Redis cannot disturb (``INFO commandstats`` is server-wide). The wrapper costs well under a
microsecond per request, in every variant alike. The record also carries the process's CPU time
since its first timed task (``time.process_time``): a cost per task that other load on the
machine disturbs far less than the wall clock.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pybreaker
import redis
import redis.connection
from celery import Celery
from celery.signals import task_postrun, task_prerun, worker_process_shutdown, worker_shutdown

from celery_resilience import ResilientTask

BROKER_URL = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/13")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", BROKER_URL)
QUEUE = os.environ.get("BENCH_QUEUE", "bench-throughput")
PREFIX = os.environ.get("BENCH_PREFIX", "bench-throughput")
STATS_KEY = os.environ.get("BENCH_STATS_KEY", f"{PREFIX}:stats")
TOTAL = int(os.environ.get("BENCH_TOTAL", "0"))
WARMUP = int(os.environ.get("BENCH_WARMUP", "0"))
#: A process writes its record every EVERY tasks, and on each of the last TAIL messages.
EVERY = 500
TAIL = 64
TASK_PREFIX = "bench."

#: Requests written to Redis by each process (key: pid; a forked child starts its own count).
round_trips: dict[int, int] = {}
_send_packed_command = redis.connection.AbstractConnection.send_packed_command


def _counting_send_packed_command(self: Any, command: Any, check_health: bool = True) -> None:
    pid = os.getpid()
    round_trips[pid] = round_trips.get(pid, 0) + 1
    _send_packed_command(self, command, check_health)


if "BENCH_STATS_KEY" in os.environ:
    redis.connection.AbstractConnection.send_packed_command = _counting_send_packed_command

app = Celery("benchapp", broker=BROKER_URL)
app.conf.update(
    task_default_queue=QUEUE,
    task_ignore_result=True,
    result_backend=None,
    # As the README recommends, in every variant: a killed worker loses nothing.
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_enable_remote_control=False,  # no pidbox traffic, no shared pidbox keys
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    resilience_redis_url=REDIS_URL,
    resilience_key_prefix=PREFIX,
    resilience_breakers={"bench": {}},
)


@app.task(name="bench.plain")
def plain(i: int) -> None:
    return None


@app.task(name="bench.resilient", base=ResilientTask, breaker="bench")
def resilient(i: int) -> None:
    return None


def _noop() -> None:
    return None


_pybreakers: dict[int, pybreaker.CircuitBreaker] = {}


def _pybreaker() -> pybreaker.CircuitBreaker:
    """This process's breaker: made on first use after the fork, never shared with the parent."""
    breaker = _pybreakers.get(os.getpid())
    if breaker is None:
        _pybreakers.clear()
        storage = pybreaker.CircuitRedisStorage(
            pybreaker.STATE_CLOSED, redis.Redis.from_url(REDIS_URL), namespace=f"{PREFIX}:pyb"
        )
        breaker = _pybreakers[os.getpid()] = pybreaker.CircuitBreaker(
            name="bench", state_storage=storage
        )
    return breaker


@app.task(name="bench.pybreaker")
def with_pybreaker(i: int) -> None:
    return _pybreaker().call(_noop)


class _Record:
    """Timing of one worker process, kept in memory."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.count = 0  # tasks run, warm-up included
        self.timed = 0  # tasks numbered >= WARMUP
        self.first = 0.0  # start of this process's first timed task
        self.cpu_first = 0.0  # this process's CPU time then
        self.last = 0.0  # end of its last timed task
        self.client: redis.Redis | None = None

    def write(self) -> None:
        if self.client is None:
            self.client = redis.Redis.from_url(BROKER_URL)
        trips = round_trips.get(self.pid, 0)
        # CPU seconds since the first timed task; the last write comes with the last task.
        cpu = time.process_time() - self.cpu_first if self.timed else 0.0
        value = f"{self.count} {self.timed} {self.first!r} {self.last!r} {trips} {cpu!r}"
        self.client.hset(STATS_KEY, str(self.pid), value)


_record: _Record | None = None


def _current() -> _Record:
    global _record  # noqa: PLW0603 - one record per process, replaced after a fork
    if _record is None or _record.pid != os.getpid():
        _record = _Record()
    return _record


def _number(task: Any, args: Any) -> int | None:
    if task is None or not task.name.startswith(TASK_PREFIX) or not args:
        return None
    return int(args[0])


def _started(task: Any = None, args: Any = None, **_: Any) -> None:
    i = _number(task, args)
    if i is not None and i >= WARMUP:
        record = _current()
        if not record.timed:
            record.first = time.time()
            record.cpu_first = time.process_time()


def _finished(task: Any = None, args: Any = None, **_: Any) -> None:
    now = time.time()
    i = _number(task, args)
    if i is None:
        return
    record = _current()
    record.count += 1
    if i >= WARMUP:
        record.timed += 1
        record.last = now
    if record.count % EVERY == 0 or i >= TOTAL - TAIL:
        record.write()


def _shutdown(**_: Any) -> None:
    # A safety net: the benchmark waits for the tail writes, but a process whose last task came
    # earlier still reports its final counts when the worker stops.
    if _record is not None and _record.pid == os.getpid() and _record.count:
        _record.write()


task_prerun.connect(_started, dispatch_uid="bench.started")
task_postrun.connect(_finished, dispatch_uid="bench.finished")
worker_process_shutdown.connect(_shutdown, dispatch_uid="bench.shutdown_child")
worker_shutdown.connect(_shutdown, dispatch_uid="bench.shutdown")
