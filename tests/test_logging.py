"""What the logs say: one clear line per event an operator cares about, never a flood.

- ``celery_resilience.breaker``: one line per transition (only the caller whose script made it
  logs it, however many callers race), and one ERROR per Redis outage (not per call) with one
  "reachable again" when it ends;
- ``celery_resilience.park``: one WARNING per park, with task name, task id, reason, breaker,
  entry id and the error;
- ``celery_resilience.drain``: one WARNING per replay, one summary per drain run that did work.

Tasks run in-process (``apply()``: eager), against the local Redis under the test's key prefix;
the outage tests use a closed port and a private ``redis-server``.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_resilience import BreakerOpen, ParkedTask, Resilience, ResilientTask
from celery_resilience.drain.lock import drain_lock
from celery_resilience.trouble import TroubleLog

from .support.forking import run_in_child
from .support.redis_server import RedisServer, free_port

pytestmark = pytest.mark.integration

OPEN_TIMEOUT = 0.5
BREAKER_LOG = "celery_resilience.breaker"
PARK_LOG = "celery_resilience.park"
DRAIN_LOG = "celery_resilience.drain"


def make_app(prefix: str, redis_url: str, **conf: Any) -> Celery:
    app = Celery(f"logs-{prefix}", set_as_current=False)
    app.conf.update(
        broker_url=redis_url,
        broker_transport_options={"global_keyprefix": f"{prefix}:broker:"},
        task_default_queue=f"{prefix}-queue",
        task_ignore_result=True,
        resilience_redis_url=redis_url,
        resilience_key_prefix=prefix,
        resilience_breakers={
            "payments": {"failure_threshold": 2, "open_timeout": OPEN_TIMEOUT},
            "search": {"failure_threshold": 2, "open_timeout": OPEN_TIMEOUT},
        },
        resilience_drain_rate=10_000.0,
        **conf,
    )
    dependency = {"up": True}

    @app.task(
        name="logs.charge",
        base=ResilientTask,
        bind=True,
        shared=False,
        breaker="payments",
        retry_on=(ConnectionError,),
        max_retries=0,
    )
    def charge(self: Any, order_id: str) -> str:
        if not dependency["up"]:
            raise ConnectionError(f"gateway down for {order_id}")
        return order_id

    app.dependency = dependency
    return app


def records(caplog: pytest.LogCaptureFixture, logger: str) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == logger]


def ours(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str, str]]:
    """The package's lines an operator reads (INFO and up; DEBUG is for debugging)."""
    return [
        (r.name, r.levelname, r.getMessage())
        for r in caplog.records
        if r.name.startswith("celery_resilience") and r.levelno >= logging.INFO
    ]


@pytest.fixture
def app(key_prefix: str, redis_url: str) -> Iterator[Celery]:
    app = make_app(key_prefix, redis_url)
    res = Resilience.for_app(app)
    res.runtime.send_events = False  # these tests are about logs; nobody listens to events here
    yield app
    res.runtime.redis.close()


@pytest.fixture
def caplog_all(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger="celery_resilience")
    return caplog


def _fail() -> None:
    raise ConnectionError("down")


# -- transitions ----------------------------------------------------------------------------------


def test_one_line_per_transition(app: Celery, caplog_all: pytest.LogCaptureFixture) -> None:
    breaker = Resilience.for_app(app).breaker("payments")
    for _ in range(2):
        with pytest.raises(ConnectionError):
            breaker.call(_fail)
    for _ in range(5):  # rejected while open: nothing to say
        with pytest.raises(BreakerOpen):
            breaker.call(lambda: None)
    time.sleep(OPEN_TIMEOUT + 0.05)
    breaker.call(lambda: None)  # the probe: half-open, then closed
    for _ in range(5):
        breaker.call(lambda: None)
    breaker.force_open()
    breaker.force_open()  # already held open: no transition, no line
    breaker.reset()
    assert records(caplog_all, BREAKER_LOG) == [
        ("WARNING", "Breaker 'payments' opened (now open)"),
        ("INFO", "Breaker 'payments' half opened (now half_open)"),
        ("INFO", "Breaker 'payments' closed (now closed)"),
        ("WARNING", "Breaker 'payments' forced open (now forced_open)"),
        ("INFO", "Breaker 'payments' reset (now closed)"),
    ]


def test_racing_failures_log_the_trip_once(
    app: Celery, caplog_all: pytest.LogCaptureFixture
) -> None:
    breaker = Resilience.for_app(app).breaker("payments")
    permits = [breaker.acquire() for _ in range(8)]
    barrier = threading.Barrier(len(permits))

    def fail(permit: Any) -> None:
        barrier.wait()
        permit.failure()

    threads = [threading.Thread(target=fail, args=(p,)) for p in permits]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert records(caplog_all, BREAKER_LOG) == [("WARNING", "Breaker 'payments' opened (now open)")]


# -- parks ----------------------------------------------------------------------------------------


def test_one_line_per_park(app: Celery, caplog_all: pytest.LogCaptureFixture) -> None:
    res = Resilience.for_app(app)
    charge = app.tasks["logs.charge"]

    res.breaker("payments").force_open()
    caplog_all.clear()
    assert charge.apply(args=("o-1",), task_id="task-open").state == "IGNORED"
    (open_entry,) = res.backout.list(reason="breaker_open")
    assert records(caplog_all, PARK_LOG) == [
        (
            "WARNING",
            f"Parked logs.charge[task-open] reason=breaker_open breaker=payments "
            f"entry={open_entry.id} error=celery_resilience.errors.BreakerOpen: "
            "breaker 'payments' is forced_open",
        )
    ]

    res.breaker("payments").reset()
    app.dependency["up"] = False
    caplog_all.clear()
    assert charge.apply(args=("o-2",), task_id="task-down").state == "IGNORED"
    (down_entry,) = res.backout.list(reason="retries_exhausted")
    assert records(caplog_all, PARK_LOG) == [
        (
            "WARNING",
            f"Parked logs.charge[task-down] reason=retries_exhausted breaker=payments "
            f"entry={down_entry.id} error=ConnectionError: gateway down for o-2",
        )
    ]
    # Nothing else spoke up louder than INFO for a park that went as planned.
    others = [r for r in ours(caplog_all) if r[0] != PARK_LOG and r[1] not in ("DEBUG", "INFO")]
    assert others == []


# -- replay and drain -----------------------------------------------------------------------------


def _park(app: Celery, n: int, **fields: Any) -> ParkedTask:
    entry = ParkedTask.new(
        task_name="logs.charge",
        task_id=f"task-{n}",
        args=[f"o-{n}"],
        breaker="payments",
        reason="breaker_open",
        **fields,
    )
    Resilience.for_app(app).runtime.backout_store.park(entry)
    return entry


def test_one_line_per_replay(app: Celery, caplog_all: pytest.LogCaptureFixture) -> None:
    entries = [_park(app, n) for n in range(2)]
    for entry in entries:
        Resilience.for_app(app).backout.replay(entry.id)
    assert records(caplog_all, DRAIN_LOG) == [
        ("WARNING", f"Replayed logs.charge[task-{n}] (entry {entry.id})")
        for n, entry in enumerate(entries)
    ]


def test_one_summary_per_drain_run(app: Celery, caplog_all: pytest.LogCaptureFixture) -> None:
    res = Resilience.for_app(app)
    for n in range(3):
        _park(app, n)
    dead = _park(app, 9, replays=res.runtime.config.max_replays)

    report = res.drain()
    assert (report.replayed, report.dead) == (3, 1)
    lines = records(caplog_all, DRAIN_LOG)
    assert lines[0] == ("ERROR", f"Entry {dead.id} (logs.charge) is dead: max_replays")
    assert len(lines) == 2, lines
    level, summary = lines[1]
    assert level == "WARNING"
    assert re.fullmatch(r"Drain: replayed=3 dead=1 skipped=0 errors=0 in \d+\.\d\ds", summary)

    # An idle run (the beat schedule's usual case) stays quiet.
    caplog_all.clear()
    assert res.drain().replayed == 0
    assert records(caplog_all, DRAIN_LOG) == []

    # A run that finds another drain at work says so, once.
    with drain_lock(res.runtime, 10.0) as lock:
        assert lock is not None
        assert res.drain().locked
    assert records(caplog_all, DRAIN_LOG) == [("INFO", "Drain skipped: another drain is running")]


# -- Redis outages --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "verdict"), [("fail_open", "admitting"), ("fail_closed", "rejecting")]
)
def test_redis_outage_logs_once_not_per_call(
    key_prefix: str, caplog_all: pytest.LogCaptureFixture, policy: str, verdict: str
) -> None:
    closed = f"redis://127.0.0.1:{free_port()}/0"
    app = make_app(key_prefix, closed, resilience_on_redis_error=policy)
    res = Resilience(app)
    ran = 0

    def call() -> None:
        nonlocal ran
        ran += 1

    for n in range(40):
        breaker = res.breaker("payments" if n % 2 else "search")
        if policy == "fail_open":
            breaker.call(call)
        else:
            with pytest.raises(BreakerOpen):
                breaker.call(call)
    assert ran == (40 if policy == "fail_open" else 0)
    (line,) = ours(caplog_all)
    name, level, message = line
    assert (name, level) == (BREAKER_LOG, "ERROR")
    assert message.startswith("Redis unreachable for breaker 'search' (ConnectionError: ")
    assert message.endswith(f"{verdict} calls until it is back ({policy})")


def test_redis_outage_and_recovery(key_prefix: str, caplog_all: pytest.LogCaptureFixture) -> None:
    with RedisServer() as server:
        res = Resilience(make_app(key_prefix, server.url))
        res.runtime.send_events = False
        breaker = res.breaker("payments")

        def calls(n: int) -> None:
            # Spread over a while: a closed breaker admits locally until its process hears
            # that Redis went away (at once, but on another thread), then asks Redis.
            for _ in range(n):
                breaker.call(lambda: None)
                time.sleep(0.02)

        calls(5)
        assert ours(caplog_all) == []

        for outage in (1, 2):
            server.kill()
            calls(20)
            server.start()
            calls(20)
            lines = [(level, message) for _, level, message in ours(caplog_all)]
            assert [level for level, _ in lines] == ["ERROR", "WARNING"] * outage, lines
            assert lines[-2][1].startswith("Redis unreachable for breaker 'payments'")
            assert lines[-1] == ("WARNING", "Redis reachable again: breakers are shared once more")
        res.runtime.close()


def test_an_outage_wide_trouble_log_counts_one_first_failure_whatever_its_causes() -> None:
    # Given a trouble log that does not tell causes apart (the breakers' Redis outage)
    outage = TroubleLog(logging.getLogger("celery_resilience.test"), "Redis", by_cause=False)
    # When failures of two causes come, then things work, then fail again
    firsts = [outage.first(exc) for exc in (ConnectionError("a"), TimeoutError("b"), OSError())]
    meanwhile = outage.recovered()
    again = outage.first(ConnectionError("c"))
    # Then only the outage's first failure is first, and the recovery counts every failure
    assert firsts == [True, False, False]
    assert meanwhile == 3
    assert outage.recovered() == 1
    assert again
    assert outage.recovered() == 0  # nothing failed since: nothing to say


def test_a_forked_child_logs_a_failure_though_a_parent_thread_held_the_log_at_the_fork() -> None:
    # Given a trouble log whose lock a thread of the parent holds (for an instant, as a failing
    # thread does) when the process forks
    outage = TroubleLog(logging.getLogger("celery_resilience.test"), "Redis", by_cause=False)
    held, release = threading.Event(), threading.Event()

    def failing() -> None:
        with outage._lock:
            held.set()
            release.wait()

    thread = threading.Thread(target=failing)
    thread.start()
    try:
        assert held.wait(30)

        # When the child counts a failure
        def child() -> dict[str, Any]:
            return {"first": outage.first(ConnectionError("down"))}

        report = run_in_child(child, 10.0)
    finally:
        release.set()
        thread.join()
    # Then it does, without the parent's thread
    assert report == {"first": True}
