"""A drain whose Redis goes away reports it and loses nothing; the next drain finishes."""

from __future__ import annotations

import uuid

import pytest
import redis
from celery import Celery

from celery_resilience import ParkedTask, Resilience
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.integration


def test_a_drain_without_its_redis_reports_an_error_and_the_next_one_finishes(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    queue = f"{key_prefix}-queue"
    with RedisServer(appendonly=True) as server:
        app = Celery("outage", broker=redis_url, set_as_current=False)
        app.conf.resilience_redis_url = server.url
        # Seconds: every write here waits for an fsync (a stopped server refuses at once).
        app.conf.resilience_redis_timeout = 5.0

        @app.task(name="outage.charge", shared=False)
        def charge(order_id: int) -> int:
            return order_id

        ids = [str(uuid.uuid4()) for _ in range(5)]
        resilience = Resilience(app)
        for n, task_id in enumerate(ids):
            resilience.runtime.backout_store.park(
                ParkedTask.new(
                    task_name="outage.charge",
                    task_id=task_id,
                    reason="breaker_open",
                    args=[n],
                    options={"queue": queue},
                )
            )
        server.stop()

        report = resilience.drain()

        assert report.errors == 1
        assert report.replayed == 0
        server.start()
        try:
            again = Resilience(app).drain()
            assert (again.replayed, again.errors) == (5, 0)
            assert redis_client.llen(queue) == 5
        finally:
            redis_client.delete(queue)
