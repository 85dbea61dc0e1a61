"""``/healthz`` of the metrics server: up while Redis answers, whatever the breakers say.

The real command (``celery -A tests.apps.cliapp resilience metrics``) against a Redis of its own,
which the test kills and starts again; and the in-process server against the suite's Redis,
with a breaker that tripped on real failures.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
import redis

from celery_resilience import BreakerOpen, Resilience
from celery_resilience.metrics import serve
from tests.apps import cliapp

from .support.metrics_server import MetricsServer, parse, value
from .support.redis_server import RedisServer, free_port

pytestmark = pytest.mark.integration


def get(port: int, path: str) -> tuple[int, str]:
    """Status and body of a GET, whatever the status."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def test_healthz_follows_redis_not_the_breakers(
    key_prefix: str, redis_url: str, private_redis: RedisServer
) -> None:
    env = {
        "CLIAPP_PREFIX": key_prefix,
        "CLIAPP_BROKER": redis_url,
        "CLIAPP_QUEUE": f"{key_prefix}-queue",
        "CLIAPP_REDIS": private_redis.url,
    }
    res = Resilience(cliapp.make_app(env))
    res.runtime.send_events = False
    server = MetricsServer(env)
    try:
        server.wait_ready()
        # Given Redis answers, the probe is 200.
        assert get(server.port, "/healthz") == (200, "ok\n")

        # When a breaker is forced open, the probe stays 200 and the metrics say open.
        res.breaker("payments").force_open()
        assert get(server.port, "/healthz") == (200, "ok\n")
        samples = server.scrape()
        assert value(samples, "breaker_state", breaker="payments", state="forced_open") == 1

        # Any other path is a 404; /metrics still serves.
        for path in ("/", "/health", "/healthz/x", "/metricsx"):
            status, body = get(server.port, path)
            assert status == 404, path
            assert "not found" in body
        assert value(server.scrape(), "up") == 1

        # When Redis dies, the probe is 503 with the reason; the scrape still answers, up 0.
        private_redis.kill()
        status, body = get(server.port, "/healthz")
        assert status == 503
        assert body.startswith("redis unreachable: ")
        assert body.endswith("\n")
        assert "\n" not in body.rstrip("\n")  # one line
        assert value(server.scrape(), "up") == 0

        # Back again: 200 from the same process.
        private_redis.start()
        assert get(server.port, "/healthz") == (200, "ok\n")
    finally:
        server.stop()
        res.runtime.close()
    output = server.output()
    assert "Traceback" not in output, output
    assert "GET /healthz" not in output  # no access log line per probe


def test_a_breaker_that_tripped_on_failures_leaves_healthz_200(
    key_prefix: str, redis_url: str, redis_client: redis.Redis
) -> None:
    env = {"CLIAPP_PREFIX": key_prefix, "CLIAPP_BROKER": redis_url}
    app = cliapp.make_app(env)
    app.conf.resilience_breakers = {"payments": {"failure_threshold": 2, "open_timeout": 60.0}}
    res = Resilience(app)
    res.runtime.send_events = False
    port = free_port()
    http, thread = serve(res, port)
    try:
        breaker = res.breaker("payments")

        def down() -> None:
            raise ConnectionError("gateway down")

        for _ in range(2):
            with pytest.raises(ConnectionError):
                breaker.call(down)
        with pytest.raises(BreakerOpen):
            breaker.call(down)
        assert breaker.state == "open"

        assert get(port, "/healthz") == (200, "ok\n")
        status, text = get(port, "/metrics")
        assert status == 200
        assert value(parse(text), "breaker_state", breaker="payments", state="open") == 1
    finally:
        http.shutdown()
        thread.join(5)
        http.server_close()
        res.runtime.close()


def test_the_beat_drain_task_run_is_a_metric(
    key_prefix: str, redis_url: str, redis_client: redis.Redis
) -> None:
    """What the "beat not alive" alert reads: no sample before the task runs, its time after."""
    env = {"CLIAPP_PREFIX": key_prefix, "CLIAPP_BROKER": redis_url}
    app = cliapp.make_app(env)
    app.conf.task_always_eager = True
    res = Resilience(app)
    res.runtime.send_events = False
    port = free_port()
    http, thread = serve(res, port)
    try:
        name = "celery_resilience_drain_task_last_run_timestamp_seconds"
        assert f"\n{name} " not in get(port, "/metrics")[1]
        before = res.runtime.now()
        app.tasks["celery_resilience.drain"].apply().get()
        ran = value(parse(get(port, "/metrics")[1]), "drain_task_last_run_timestamp_seconds")
        assert ran is not None
        assert before <= ran <= res.runtime.now()
    finally:
        http.shutdown()
        thread.join(5)
        http.server_close()
        res.runtime.close()
