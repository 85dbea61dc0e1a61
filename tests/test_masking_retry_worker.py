"""A retry whose error quotes a sensitive argument runs as one whose error does not: the error
shown in its place (its message masked) keeps the error's type, whatever the type's constructor
takes or its ``__str__`` reads, and crosses a prefork pool's pipe and the result backend (json
or pickle).

A real ``celery worker`` runs ``workerapp.gateway(order_id)`` with ``resilience_sensitive_keys =
["order_id"]``: its error, ``GatewayError(502, "order <id> refused")``, is built from two
arguments and shown by an ``__str__`` that reads an attribute. One order fails once and then
succeeds; another fails until its retries run out and is parked.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery.result import AsyncResult

from celery_resilience import Resilience

from .apps.workerapp import broker_keyprefix, make_app
from .support.waiting import wait_for
from .support.worker_process import WorkerProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def world(redis_url: str, redis_client: redis.Redis, key_prefix: str) -> Iterator[dict[str, str]]:
    env = {
        "WORKERAPP_PREFIX": key_prefix,
        "WORKERAPP_QUEUE": f"{key_prefix}-queue",
        "WORKERAPP_BROKER": redis_url,
        "WORKERAPP_FAILURE_THRESHOLD": "100",
        "WORKERAPP_MAX_RETRIES": "2",
        "WORKERAPP_BACKOFF_BASE": "0.05",
        "WORKERAPP_SENSITIVE_KEYS": "order_id",
    }
    yield env
    queue = env["WORKERAPP_QUEUE"]
    redis_client.delete(queue, f"_kombu.binding.{queue}")
    for key in redis_client.scan_iter(match=f"{broker_keyprefix(key_prefix)}*"):
        redis_client.delete(key)


@pytest.mark.parametrize(
    ("serializer", "pool"),
    [("json", "solo"), ("pickle", "solo"), ("pickle", "prefork")],
)
def test_a_retry_on_an_error_shown_masked_retries_and_parks_as_any_other(
    world: dict[str, str],
    redis_client: redis.Redis,
    key_prefix: str,
    tmp_path: Path,
    serializer: str,
    pool: str,
) -> None:
    world["WORKERAPP_RESULT_SERIALIZER"] = serializer
    app = make_app(world)
    res = Resilience.for_app(app)
    gateway = app.tasks["workerapp.gateway"]
    worker = WorkerProcess(world, tmp_path / "worker.log", pool=pool)
    recovers, fails = (f"order-{uuid.uuid4().hex}" for _ in range(2))
    try:
        worker.start()
        # Given an order that fails once: it retries, then succeeds.
        redis_client.set(f"{key_prefix}:gateway:fails", 1)
        first = gateway.delay(recovers)
        assert first.get(timeout=60) is True
        # Given an order that fails every time: it retries twice, then is parked.
        redis_client.set(f"{key_prefix}:gateway:fails", 100)
        second = gateway.delay(fails)
        wait_for(lambda: res.backout.count() == 1, "the failing order parked", 60.0)
        wait_for(lambda: AsyncResult(second.id, app=app).state == "PARKED", "PARKED", 30.0)
        [entry] = res.backout.list()
    finally:
        log = worker.stop()
        res.runtime.close()
        app.close()
    assert entry.task_id == second.id
    assert (entry.reason, entry.retries) == ("retries_exhausted", 2)
    assert entry.exc_type.endswith("GatewayError")
    assert entry.exc_message == f"gateway 502: order {fails} refused"  # the store keeps it
    assert log.count("Retry in") == 3, log
    assert "gateway 502: order *** refused" in log
    assert recovers not in log
    assert fails not in log
    assert "Traceback" not in log, log
