"""Celery app of the outage benchmark's worker and beat (driven by ``outage.py``).

Configured from the environment, which ``outage.py`` sets before it starts
``celery -A benchmarks.outageapp worker`` (and ``beat``) for one variant:

====================  ======================================================================
OUTAGE_BROKER_URL     broker (Redis), also the resilience Redis, pybreaker's and the records'
OUTAGE_PREFIX         the variant's own key prefix: broker keys (kombu ``global_keyprefix``),
                      resilience ``key_prefix``, pybreaker namespace, records
OUTAGE_QUEUE          the variant's own queue (charges, reports and drains alike)
OUTAGE_GATEWAY_URL    the gateway's API (``outagegateway.py``)
OUTAGE_DRAIN_EVERY    seconds between beat's drains (``Resilience.beat_schedule(every=...)``)
OUTAGE_DRAIN_RATE     ``resilience_drain_rate`` (unset: the package's default)
OUTAGE_DRAIN_BATCH    ``resilience_drain_batch`` (unset: the package's default)
OUTAGE_BULKHEAD       the ``gateway`` breaker's ``max_concurrent_calls`` (unset: no bulkhead)
OUTAGE_SOFT_LIMIT     the resilient charge's ``soft_time_limit`` in seconds (unset: none)
OUTAGE_ON_OPEN        the resilient charge's ``on_open`` (unset: the package's ``park``)
====================  ======================================================================

Two task types share the queue. ``outage.report(n)`` does ~5 ms of local work and calls
nothing. ``charge(order_id)`` POSTs to the gateway with a 2 s timeout, in three variants:

* ``outage.charge.plain``: plain Celery the documented way, ``autoretry_for=(RequestException,)``,
  ``retry_backoff=True``, ``retry_jitter=True``, ``max_retries=5``;
* ``outage.charge.pybreaker``: the same, calling through ``pybreaker.CircuitBreaker`` kept in
  Redis by ``CircuitRedisStorage`` (``fail_max`` 5, ``reset_timeout`` 5 s), with
  ``CircuitBreakerError`` retried too;
* ``outage.charge.resilient``: ``ResilientTask`` on the shared breaker ``gateway``
  (``failure_threshold`` 5, ``open_timeout`` 5 s), ``retry_on=(RequestException,)``,
  ``max_retries=5``, ``Exponential(base=1.0, cap=300.0, jitter="full")``: the delays of the plain
  variant; parked tasks come back through beat's drain.

Records, one ``RPUSH`` each (the same in every variant), under ``<prefix>:rec:``: ``reports``
(``n finished``), ``calls`` (``order_id started ended outcome``: each call the client made,
``ok`` or the exception's name) and ``failed`` (``order_id time``: a charge's Celery FAILURE,
its retries spent).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, cast

import pybreaker
import redis
import requests
from celery import Celery
from celery.signals import task_failure

from celery_resilience import Resilience, ResilientTask, backoff

BROKER_URL = os.environ.get("OUTAGE_BROKER_URL", "redis://127.0.0.1:6379/12")
PREFIX = os.environ.get("OUTAGE_PREFIX", "outage")
QUEUE = os.environ.get("OUTAGE_QUEUE", PREFIX)
GATEWAY_URL = os.environ.get("OUTAGE_GATEWAY_URL", "http://127.0.0.1:8099")
DRAIN_EVERY = float(os.environ.get("OUTAGE_DRAIN_EVERY", "5"))
DRAIN_RATE = float(os.environ.get("OUTAGE_DRAIN_RATE") or 0) or None
DRAIN_BATCH = int(os.environ.get("OUTAGE_DRAIN_BATCH") or 0) or None
BULKHEAD = int(os.environ.get("OUTAGE_BULKHEAD") or 0) or None
SOFT_LIMIT = float(os.environ.get("OUTAGE_SOFT_LIMIT") or 0) or None
ON_OPEN = os.environ.get("OUTAGE_ON_OPEN") or "park"

#: The client's timeout (connect, and read): what a hung gateway costs a worker per call.
TIMEOUT = 2.0
FAILURE_THRESHOLD = 5
OPEN_TIMEOUT = 5.0
MAX_RETRIES = 5
REPORT_WORK = 0.005
BREAKER = "gateway"
TASKS = {
    "plain": "outage.charge.plain",
    "pybreaker": "outage.charge.pybreaker",
    "resilient": "outage.charge.resilient",
}
REPORT = "outage.report"


def settings(
    broker_url: str,
    prefix: str,
    queue: str,
    drain_rate: float | None = None,
    drain_batch: int | None = None,
) -> dict[str, Any]:
    """The app's settings for one variant (``outage.py`` reads the same store with them)."""
    drain = {"resilience_drain_rate": drain_rate, "resilience_drain_batch": drain_batch}
    return {
        **{name: value for name, value in drain.items() if value is not None},
        "broker_url": broker_url,
        # Every broker key under the variant's prefix: the script deletes exactly its own.
        "broker_transport_options": {"global_keyprefix": f"{prefix}:broker:"},
        "task_default_queue": queue,
        "task_ignore_result": True,
        "result_backend": None,
        # In every variant: a message is acked after the task ran, and requeued if its worker
        # child died.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_enable_remote_control": False,
        "worker_hijack_root_logger": False,
        "broker_connection_retry_on_startup": True,
        "resilience_redis_url": broker_url,
        "resilience_key_prefix": prefix,
        "resilience_breakers": {
            BREAKER: {
                "failure_threshold": FAILURE_THRESHOLD,
                "open_timeout": OPEN_TIMEOUT,
                "max_concurrent_calls": BULKHEAD,
            }
        },
    }


app = Celery("outageapp")
app.conf.update(settings(BROKER_URL, PREFIX, QUEUE, DRAIN_RATE, DRAIN_BATCH))
app.conf.beat_schedule = {
    "resilience-drain": Resilience.for_app(app).beat_schedule(every=DRAIN_EVERY)
}


def _task(**options: Any) -> Callable[[Callable[..., None]], Any]:
    """``app.task(**options)``, typed: Celery's decorator is not."""
    return cast(Callable[[Callable[..., None]], Any], app.task(**options))


_clients: dict[int, redis.Redis] = {}


def record(kind: str, line: str) -> None:
    """Append one record; each process opens its own client, after the fork."""
    client = _clients.get(os.getpid())
    if client is None:
        _clients.clear()
        client = _clients[os.getpid()] = redis.Redis.from_url(BROKER_URL)
    client.rpush(f"{PREFIX}:rec:{kind}", line)


def call_gateway(order_id: int) -> None:
    """One ``POST /charges``; a ``RequestException`` for anything but a 2xx answer."""
    started, outcome = time.time(), "ok"
    try:
        response = requests.post(
            f"{GATEWAY_URL}/charges",
            json={"order_id": order_id, "amount": "10.00"},
            headers={"Idempotency-Key": str(order_id)},
            timeout=TIMEOUT,
        )
        response.raise_for_status()
    except requests.RequestException as exc:
        outcome = type(exc).__name__
        raise
    finally:
        record("calls", f"{order_id} {started!r} {time.time()!r} {outcome}")


@_task(name=REPORT)
def report(n: int) -> None:
    deadline = time.perf_counter() + REPORT_WORK
    while time.perf_counter() < deadline:  # local work: the CPU, nothing else
        pass
    record("reports", f"{n} {time.time()!r}")


@_task(
    name=TASKS["plain"],
    autoretry_for=(requests.RequestException,),
    retry_backoff=True,
    retry_jitter=True,
    max_retries=MAX_RETRIES,
)
def charge_plain(order_id: int) -> None:
    call_gateway(order_id)


_pybreakers: dict[int, pybreaker.CircuitBreaker] = {}


def _pybreaker() -> pybreaker.CircuitBreaker:
    """This process's breaker (state shared in Redis), made after the fork."""
    breaker = _pybreakers.get(os.getpid())
    if breaker is None:
        _pybreakers.clear()
        storage = pybreaker.CircuitRedisStorage(
            pybreaker.STATE_CLOSED, redis.Redis.from_url(BROKER_URL), namespace=f"{PREFIX}:pyb"
        )
        breaker = _pybreakers[os.getpid()] = pybreaker.CircuitBreaker(
            fail_max=FAILURE_THRESHOLD,
            reset_timeout=OPEN_TIMEOUT,
            state_storage=storage,
            name=BREAKER,
        )
    return breaker


@_task(
    name=TASKS["pybreaker"],
    autoretry_for=(requests.RequestException, pybreaker.CircuitBreakerError),
    retry_backoff=True,
    retry_jitter=True,
    max_retries=MAX_RETRIES,
)
def charge_pybreaker(order_id: int) -> None:
    _pybreaker().call(call_gateway, order_id)


@_task(
    name=TASKS["resilient"],
    base=ResilientTask,
    breaker=BREAKER,
    retry_on=(requests.RequestException,),
    max_retries=MAX_RETRIES,
    backoff=backoff.Exponential(base=1.0, cap=300.0, jitter="full"),
    call_timeout=TIMEOUT,  # the client's own timeout, declared (what `check` asks for)
    soft_time_limit=SOFT_LIMIT,
    on_open=ON_OPEN,
)
def charge_resilient(order_id: int) -> None:
    call_gateway(order_id)


def _failed(sender: Any = None, args: Any = None, **_: Any) -> None:
    if getattr(sender, "name", "").startswith("outage.charge.") and args:
        record("failed", f"{args[0]} {time.time()!r}")


task_failure.connect(_failed, dispatch_uid="outage.failed")
