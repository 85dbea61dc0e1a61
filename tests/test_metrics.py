"""Prometheus metrics read from Redis: the collector in-process and the real command over HTTP.

A scenario runs in the test process (breaker calls, parks, retries counted, drains and replays)
against one key prefix; at each step the same figures must come out of
:class:`ResilienceCollector` in a private ``CollectorRegistry``, out of a real
``celery -A tests.apps.cliapp resilience metrics --port N`` scraped over HTTP, and (at the end) out
of ``celery -A tests.apps.cliapp resilience status --json``.

Breaker ``search`` keeps cliapp's open timeout (30 s), so its ``open`` state can't turn
``half_open`` between two reads; ``payments`` gets 0.3 s here for a full trip / probe / close
cycle (a snapshot reads the stored ``open_until``: the serving process needs no such setting).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from prometheus_client import CollectorRegistry, generate_latest

from celery_resilience import BreakerOpen, BulkheadFull, ParkedTask, Resilience
from celery_resilience.metrics import ResilienceCollector
from tests.apps import cliapp

from .support.metrics_server import PREFIX, MetricsServer, Samples, parse, value
from .support.redis_server import RedisServer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
SHORT_OPEN = 0.3
STATES = ("closed", "open", "half_open", "forced_open", "forced_closed")


class World:
    def __init__(self, env: dict[str, str], server: MetricsServer) -> None:
        self.env = env
        self.app: Celery = cliapp.make_app(env)
        self.app.conf.resilience_breakers = {
            "payments": {"failure_threshold": 3, "open_timeout": SHORT_OPEN},
            "search": {"failure_threshold": 3, "open_timeout": 30.0},
        }
        self.res = Resilience.for_app(self.app)
        self.res.runtime.send_events = False  # nobody listens; these tests are about Redis figures
        self.registry = CollectorRegistry()
        self.registry.register(ResilienceCollector(self.res))
        self.server = server

    def collect(self) -> Samples:
        return parse(generate_latest(self.registry).decode())

    def both(self) -> Samples:
        """The collector's figures, checked equal to the command's over HTTP."""
        local = self.collect()
        remote = self.server.scrape()
        # An age grows between the two reads: the same within the time the reads took.
        age: tuple[str, frozenset[tuple[str, str]]] = (
            PREFIX + "oldest_parked_age_seconds",
            frozenset(),
        )
        assert abs(remote.pop(age) - local[age]) < 5
        assert remote == {k: v for k, v in local.items() if k != age}, _diff(local, remote)
        return local

    def status(self) -> dict[str, Any]:
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.apps.cliapp",
            "resilience",
            "status",
        ]
        done = subprocess.run(
            [*command, "--json"],
            cwd=ROOT,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout))

    def park(self, task_name: str, breaker: str | None, reason: str, **fields: Any) -> ParkedTask:
        entry = ParkedTask.new(
            task_name=task_name,
            task_id=f"{self.env['CLIAPP_PREFIX']}-{task_name}-{time.monotonic_ns()}",
            args=["x"],
            breaker=breaker,
            reason=reason,  # type: ignore[arg-type]
            **fields,
        )
        self.res.runtime.backout_store.park(entry)
        return entry


def _diff(local: Samples, remote: Samples) -> str:
    keys = sorted(set(local) | set(remote), key=str)
    lines = [
        f"{name}{dict(labels)}: collector={local.get((name, labels))} "
        f"http={remote.get((name, labels))}"
        for name, labels in keys
        if local.get((name, labels)) != remote.get((name, labels))
    ]
    return "collector and HTTP disagree:\n" + "\n".join(lines)


@pytest.fixture
def world(key_prefix: str, redis_url: str, redis_client: redis.Redis) -> Iterator[World]:
    env = {
        "CLIAPP_PREFIX": key_prefix,
        "CLIAPP_BROKER": redis_url,
        "CLIAPP_QUEUE": f"{key_prefix}-queue",
    }
    server = MetricsServer(env)
    try:
        server.wait_ready()
        world = World(env, server)
        yield world
        world.res.runtime.close()
    finally:
        server.stop()


def _fail() -> None:
    raise ConnectionError("dependency down")


def _state(samples: Samples, breaker: str) -> str:
    states = [s for s in STATES if value(samples, "breaker_state", breaker=breaker, state=s)]
    assert len(states) == 1, states
    return states[0]


def test_metrics_follow_the_scenario(world: World) -> None:
    start = world.both()
    for name in ("payments", "search"):
        assert _state(start, name) == "closed"
        for transition in ("opened", "half_opened", "closed"):
            key = {"breaker": name, "transition": transition}
            assert value(start, "breaker_transitions_total", **key) == 0
        assert value(start, "breaker_calls_total", breaker=name, outcome="failure") == 0
    assert value(start, "drain_runs_total") == 0
    assert not [k for k in start if k[0] == PREFIX + "parked_total"]

    _search_trips_and_rejects(world)
    _payments_trip_probe_close(world)
    _parks(world)
    _retries(world)
    _drains_and_replays(world)
    _status_shows_the_same(world)


def _search_trips_and_rejects(world: World) -> None:
    """2 successes, 3 failures (failure_threshold): open; then 2 calls rejected."""
    search = world.res.breaker("search")
    for _ in range(2):
        search.call(lambda: "ok")
    for _ in range(3):
        with pytest.raises(ConnectionError):
            search.call(_fail)
    for _ in range(2):
        with pytest.raises(BreakerOpen):
            search.call(lambda: "never runs")
    step = world.both()
    assert _state(step, "search") == "open"
    assert value(step, "breaker_transitions_total", breaker="search", transition="opened") == 1
    assert value(step, "breaker_calls_total", breaker="search", outcome="success") == 2
    assert value(step, "breaker_calls_total", breaker="search", outcome="failure") == 3
    assert value(step, "breaker_rejected_calls_total", breaker="search", reason="breaker_open") == 2
    assert value(step, "breaker_consecutive_failures", breaker="search") == 0  # cleared by trip
    assert _state(step, "payments") == "closed"


def _payments_trip_probe_close(world: World) -> None:
    """Six failures at once trip it once; a failed probe trips it again; a good one closes it."""
    payments = world.res.breaker("payments")
    permits = [payments.acquire() for _ in range(6)]
    barrier = threading.Barrier(len(permits))

    def fail(permit: Any) -> None:
        barrier.wait()
        permit.failure()

    threads = [threading.Thread(target=fail, args=(p,)) for p in permits]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    step = world.collect()
    assert value(step, "breaker_transitions_total", breaker="payments", transition="opened") == 1
    assert value(step, "breaker_calls_total", breaker="payments", outcome="failure") == 6

    time.sleep(SHORT_OPEN + 0.05)
    with pytest.raises(ConnectionError):
        payments.call(_fail)  # the probe: back to open
    time.sleep(SHORT_OPEN + 0.05)
    payments.call(lambda: "ok")  # the probe: closed
    step = world.both()
    assert _state(step, "payments") == "closed"
    transitions = {
        t: value(step, "breaker_transitions_total", breaker="payments", transition=t)
        for t in ("opened", "half_opened", "closed")
    }
    assert transitions == {"opened": 2, "half_opened": 2, "closed": 1}
    assert value(step, "breaker_calls_total", breaker="payments", outcome="failure") == 7
    assert value(step, "breaker_calls_total", breaker="payments", outcome="success") == 1
    assert (
        value(step, "breaker_rejected_calls_total", breaker="payments", reason="breaker_open") == 0
    )


def _parks(world: World) -> None:
    """Two parked by the task (search is open), two straight into the store."""
    lookup = world.app.tasks["cliapp.lookup"]
    for query in ("a", "b"):
        assert lookup.apply(args=(query,)).state == "IGNORED"  # parked: breaker_open
    world.park("cliapp.charge", "payments", "retries_exhausted")
    world.park("cliapp.notify", None, "park_on")
    step = world.both()
    entries = {
        (breaker, status): value(step, "backout_entries", breaker=breaker, status=status)
        for breaker in ("search", "payments", "")
        for status in ("parked", "dead")
    }
    assert entries == {
        ("search", "parked"): 2,
        ("search", "dead"): 0,
        ("payments", "parked"): 1,
        ("payments", "dead"): 0,
        ("", "parked"): 1,
        ("", "dead"): 0,
    }
    assert value(step, "parked_total", breaker="search", reason="breaker_open") == 2
    assert value(step, "parked_total", breaker="payments", reason="retries_exhausted") == 1
    assert value(step, "parked_total", breaker="", reason="park_on") == 1
    # Rejected admissions of the task count as rejected calls too.
    assert value(step, "breaker_rejected_calls_total", breaker="search", reason="breaker_open") == 4


def _retries(world: World) -> None:
    """Retries counted by the task's retry path (``Runtime.count_retry``)."""
    world.res.runtime.count_retry("payments")
    world.res.runtime.count_retry("payments")
    world.res.runtime.count_retry(None)
    step = world.both()
    assert value(step, "retries_scheduled_total", breaker="payments") == 2
    assert value(step, "retries_scheduled_total", breaker="") == 1


def _drains_and_replays(world: World) -> None:
    res = world.res
    # payments (closed) and no-breaker entries go, search (open) stays.
    report = res.drain()
    assert (report.replayed, report.dead, report.skipped) == (2, 0, 2)
    step = world.both()
    assert value(step, "drain_runs_total") == 1
    assert value(step, "replayed_total", breaker="payments") == 1
    assert value(step, "replayed_total", breaker="") == 1
    assert value(step, "replayed_total", breaker="search") is None  # nothing replayed yet
    assert value(step, "backout_entries", breaker="search", status="parked") == 2
    # Emptied groups read 0 (a gauge that vanished would read "no data" on a dashboard).
    assert value(step, "backout_entries", breaker="payments", status="parked") == 0
    assert value(step, "backout_entries", breaker="", status="parked") == 0
    drain_seconds = value(step, "drain_seconds_total")
    assert drain_seconds is not None
    assert drain_seconds > 0

    # An operator replays one search entry; a drain marks an entry out of replays dead.
    first = res.backout.list(breaker="search")[0]
    res.backout.replay(first.id)
    world.park("cliapp.charge", "payments", "breaker_open", replays=res.runtime.config.max_replays)
    report = res.drain()
    assert (report.replayed, report.dead) == (0, 1)
    step = world.both()
    assert value(step, "replayed_total", breaker="search") == 1
    assert value(step, "dead_total", breaker="payments") == 1
    assert value(step, "backout_entries", breaker="payments", status="dead") == 1
    assert value(step, "backout_entries", breaker="search", status="parked") == 1
    assert value(step, "drain_runs_total") == 2
    assert value(step, "parked_total", breaker="payments", reason="breaker_open") == 1


def _status_shows_the_same(world: World) -> None:
    """``celery resilience status --json``: the figures of the metrics, breaker by breaker."""
    status = world.status()
    step = world.both()
    assert set(status["breakers"]) == {"payments", "search"}
    for name, snap in status["breakers"].items():
        assert _state(step, name) == snap["state"]
        gauges = {
            "breaker_consecutive_failures": "consecutive_failures",
            "breaker_window_calls": "window_calls",
            "breaker_window_failures": "window_failures",
            "breaker_calls_in_flight": "calls_in_flight",
            "breaker_window_retries": "window_retries",
        }
        for metric, field in gauges.items():
            assert value(step, metric, breaker=name) == snap[field], metric
        rejected = {
            reason: value(step, "breaker_rejected_calls_total", breaker=name, reason=reason)
            for reason in ("breaker_open", "bulkhead_full")
        }
        full = snap["bulkhead_rejected_total"]
        assert rejected == {"breaker_open": snap["rejected_total"] - full, "bulkhead_full": full}
        for transition in ("opened", "half_opened", "closed"):
            labels = {"breaker": name, "transition": transition}
            expected = snap[f"{transition}_total"]
            assert value(step, "breaker_transitions_total", **labels) == expected
        for outcome, field in (("success", "successes_total"), ("failure", "failures_total")):
            assert value(step, "breaker_calls_total", breaker=name, outcome=outcome) == snap[field]
        refused = value(step, "breaker_retries_refused_total", breaker=name)
        assert refused == snap["retry_budget_refused_total"]
        for status_name in ("parked", "dead"):
            labels = {"breaker": name, "status": status_name}
            assert value(step, "backout_entries", **labels) == snap[status_name]
    assert status["no_breaker"] == {
        "parked": value(step, "backout_entries", breaker="", status="parked"),
        "dead": value(step, "backout_entries", breaker="", status="dead"),
    }


def test_a_full_bulkhead_is_a_rejection_of_its_own_and_calls_in_flight_a_gauge(
    key_prefix: str, redis_url: str
) -> None:
    app = Celery("metrics-bulkhead", broker=redis_url, set_as_current=False)
    app.conf.resilience_redis_url = redis_url
    app.conf.resilience_key_prefix = key_prefix
    app.conf.resilience_breakers = {"gateway": {"max_concurrent_calls": 1}}
    res = Resilience(app)
    registry = CollectorRegistry()
    registry.register(ResilienceCollector(res))
    try:
        gateway = res.breaker("gateway")
        held = gateway.acquire()
        for _ in range(2):
            with pytest.raises(BulkheadFull):
                gateway.call(lambda: "never runs")
        step = parse(generate_latest(registry).decode())
        rejected = {
            reason: value(step, "breaker_rejected_calls_total", breaker="gateway", reason=reason)
            for reason in ("breaker_open", "bulkhead_full")
        }
        assert rejected == {"breaker_open": 0, "bulkhead_full": 2}
        assert value(step, "breaker_calls_in_flight", breaker="gateway") == 1
        held.success()
        step = parse(generate_latest(registry).decode())
        assert value(step, "breaker_calls_in_flight", breaker="gateway") == 0
    finally:
        res.runtime.close()


def test_collector_registers_and_serves_nothing_stale(world: World) -> None:
    """The collector reads Redis on every scrape: a change shows at the very next one."""
    breaker = world.res.breaker("search")
    assert _state(world.collect(), "search") == "closed"
    breaker.force_open()
    assert _state(world.collect(), "search") == "forced_open"
    breaker.force_closed()
    assert _state(world.both(), "search") == "forced_closed"
    breaker.reset()
    samples = world.both()
    assert _state(samples, "search") == "closed"
    # Operator orders are not trips: the transition counters stay at zero.
    for transition in ("opened", "half_opened", "closed"):
        labels = {"breaker": "search", "transition": transition}
        assert value(samples, "breaker_transitions_total", **labels) == 0


# -- an outage and a busy port ------------------------------------------------------------


def _charge(task_id: str, parked_at: float) -> ParkedTask:
    return ParkedTask.new(
        task_name="cliapp.charge",
        task_id=task_id,
        args=["x"],
        breaker="payments",
        reason="breaker_open",
        parked_at=parked_at,
    )


def test_redis_away_is_up_zero_not_an_http_500_and_up_again_when_it_is_back(
    key_prefix: str, redis_url: str
) -> None:
    """The metrics command against a Redis of its own, which the test starts late, stops and
    starts again."""
    private = RedisServer()
    try:
        env = {
            "CLIAPP_PREFIX": key_prefix,
            "CLIAPP_BROKER": redis_url,
            "CLIAPP_QUEUE": f"{key_prefix}-queue",
            "CLIAPP_REDIS": private.url,
        }
        app = cliapp.make_app(env)
        res = Resilience(app)
        res.runtime.send_events = False
        server = MetricsServer(env)
        try:
            server.wait_ready()  # it serves before its Redis runs: up 0, then up 1
            assert value(server.scrape(), "up") == 0
            private.start()
            fresh = server.scrape()
            assert value(fresh, "up") == 1
            assert value(fresh, "oldest_parked_age_seconds") == 0  # nothing waits
            assert value(fresh, "last_drain_timestamp_seconds") is None  # never drained

            # Given a task parked 100 s ago (Redis time) and a dead one older still,
            now = res.runtime.now()
            old = _charge("t-dead", parked_at=now - 500)
            res.runtime.backout_store.park(old)
            res.runtime.backout_store.mark_dead(old.id, "max_replays")
            res.runtime.backout_store.park(_charge("t-1", parked_at=now - 100))
            res.breaker("payments").force_open()  # the drain holds it back, and says so
            # when a drain finishes a pass,
            report = res.drain()
            assert (report.skipped, report.errors) == (1, 0)
            step = server.scrape()
            # then the age is the waiting task's (not the dead one's) and the drain's time shows.
            age = value(step, "oldest_parked_age_seconds")
            assert age is not None
            assert 100 <= age < 130
            drained = value(step, "last_drain_timestamp_seconds")
            assert drained is not None
            assert now <= drained <= res.runtime.now()
            assert value(step, "breaker_state", breaker="payments", state="forced_open") == 1

            # When Redis goes away, a scrape still answers 200: up is 0, nothing stale.
            private.stop()
            down = server.scrape()  # urlopen raises on a 500
            assert value(down, "up") == 0
            assert not [k for k in down if k[0] == PREFIX + "breaker_state"]
            assert value(down, "oldest_parked_age_seconds") is None

            # Back (empty: no AOF), up is 1 again with the same process.
            private.start()
            back = server.scrape()
            assert value(back, "up") == 1
            assert value(back, "breaker_state", breaker="payments", state="closed") == 1
        finally:
            server.stop()
            res.runtime.close()
        output = server.output()
        assert "Traceback" not in output, output
    finally:
        private.close()


def test_a_port_in_use_is_one_clear_line_and_a_failed_exit(key_prefix: str, redis_url: str) -> None:
    env = {"CLIAPP_PREFIX": key_prefix, "CLIAPP_BROKER": redis_url}
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [
            sys.executable, "-m", "celery", "-A", "tests.apps.cliapp", "resilience", "metrics",
            "--port", str(port),
        ]  # fmt: skip
        done = subprocess.run(
            command, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True,
            timeout=180, check=False,
        )  # fmt: skip
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        f"Error: cannot serve metrics on 127.0.0.1:{port}: Address already in use"
    )
