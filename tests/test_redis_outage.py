"""A breaker whose Redis is gone follows ``resilience_on_redis_error``, decides within the
Redis timeout, logs the outage once, and works again once Redis is back."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_resilience import BreakerOpen, Resilience
from celery_resilience.breaker import Breaker
from celery_resilience.breaker.knowledge import MAX_KNOWLEDGE_AGE
from tests.support.redis_server import RedisServer, free_port
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

TIMEOUT = 0.2  # resilience_redis_timeout
DECIDES_WITHIN = 1.0  # seconds: a generous bound on "about two timeouts"
LOGGER = "celery_resilience.breaker"


class Boom(Exception):
    pass


def boom() -> None:
    raise Boom("dependency down")


MakeBreaker = Callable[..., Breaker]


@pytest.fixture
def make_breaker() -> Iterator[MakeBreaker]:
    made: list[Resilience] = []

    def make(url: str, policy: str, timeout: float = TIMEOUT) -> Breaker:
        app = Celery("t", broker=url, set_as_current=False)
        app.conf.resilience_redis_url = url
        app.conf.resilience_key_prefix = "outage-test"
        app.conf.resilience_redis_timeout = timeout
        app.conf.resilience_on_redis_error = policy
        app.conf.resilience_breakers = {"dep": {"failure_threshold": 2, "open_timeout": 30.0}}
        resilience = Resilience(app)
        made.append(resilience)
        return resilience.breaker("dep")

    yield make
    for resilience in made:
        resilience.runtime.close()


@pytest.fixture
def closed_port_url() -> str:
    """Nothing listens there: connections are refused."""
    return f"redis://127.0.0.1:{free_port()}/0"


@pytest.fixture
def hanging_url() -> Iterator[str]:
    """A port that accepts TCP connections (the kernel's backlog) but never answers."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        yield f"redis://127.0.0.1:{sock.getsockname()[1]}/0"


@dataclass(frozen=True)
class Unreachable:
    url: str
    calls: int  # a hanging Redis costs a timeout per call: fewer calls keep the test fast


@pytest.fixture(params=["refused", "hanging"])
def unreachable(request: pytest.FixtureRequest) -> Unreachable:
    if request.param == "refused":
        return Unreachable(request.getfixturevalue("closed_port_url"), 20)
    return Unreachable(request.getfixturevalue("hanging_url"), 3)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    started = time.monotonic()
    try:
        result: Any = fn()
    except Exception as exc:
        result = exc
    return result, time.monotonic() - started


def outage_logs(caplog: pytest.LogCaptureFixture) -> tuple[int, int]:
    """(errors saying Redis is unreachable, warnings saying it is reachable again)."""
    records = [r for r in caplog.records if r.name == LOGGER]
    down = [r for r in records if r.levelno == logging.ERROR and "unreachable" in r.msg]
    up = [r for r in records if r.levelno == logging.WARNING and "reachable again" in r.msg]
    return len(down), len(up)


# -- (a) nothing answers -------------------------------------------------------------------------
def test_fail_open_runs_the_call_and_logs_the_outage_once(
    make_breaker: MakeBreaker, unreachable: Unreachable, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    breaker = make_breaker(unreachable.url, "fail_open")
    ran: list[int] = []
    for n in range(unreachable.calls):
        result, elapsed = timed(lambda n=n: breaker.call(lambda: ran.append(n) or n))  # type: ignore[misc, func-returns-value]
        assert result == n
        assert elapsed < DECIDES_WITHIN
    assert ran == list(range(unreachable.calls))
    assert outage_logs(caplog) == (1, 0)


def test_fail_open_lets_the_calls_own_exception_through(
    make_breaker: MakeBreaker, closed_port_url: str
) -> None:
    breaker = make_breaker(closed_port_url, "fail_open")
    with pytest.raises(Boom):
        breaker.call(boom)
    permit = breaker.acquire()  # an unrecorded permit: reporting it does nothing and never raises
    permit.failure()
    permit.success()


def test_fail_closed_rejects_as_unavailable_and_logs_the_outage_once(
    make_breaker: MakeBreaker, unreachable: Unreachable, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    breaker = make_breaker(unreachable.url, "fail_closed")
    ran: list[int] = []
    for _ in range(unreachable.calls):
        result, elapsed = timed(lambda: breaker.call(ran.append, 1))
        assert isinstance(result, BreakerOpen)
        assert (result.breaker, result.state, result.retry_after) == ("dep", "unavailable", None)
        assert elapsed < DECIDES_WITHIN
    assert ran == []
    assert outage_logs(caplog) == (1, 0)


@pytest.mark.parametrize("policy", ["fail_open", "fail_closed"])
def test_a_hanging_redis_is_given_up_on_within_two_timeouts(
    make_breaker: MakeBreaker, hanging_url: str, policy: str
) -> None:
    # A longer timeout than the other tests': a stall of the test process must not look like a
    # third timeout (a call costs at most two; a third would take three).
    timeout = 0.5
    breaker = make_breaker(hanging_url, policy, timeout)
    for _ in range(2):
        _, elapsed = timed(lambda: breaker.call(lambda: None))
        # The timeout decides (no instant error), and nothing stacks retries on top of it.
        assert timeout * 0.9 < elapsed < 3 * timeout - 0.05


# -- (b) a real Redis that stops and comes back ---------------------------------------------------
@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as running:
        yield running


def assert_follows_policy(breaker: Breaker, policy: str) -> None:
    ran: list[int] = []
    for _ in range(5):
        result, elapsed = timed(lambda: breaker.call(lambda: ran.append(1) or "ran"))  # type: ignore[func-returns-value]  # a spy
        assert elapsed < DECIDES_WITHIN
        if policy == "fail_open":
            assert result == "ran"
        else:
            assert isinstance(result, BreakerOpen)
            assert result.state == "unavailable"
    assert len(ran) == (5 if policy == "fail_open" else 0)


@pytest.mark.parametrize("policy", ["fail_open", "fail_closed"])
def test_a_stopped_redis_follows_the_policy_and_a_restarted_one_is_used_again(
    make_breaker: MakeBreaker, server: RedisServer, caplog: pytest.LogCaptureFixture, policy: str
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    breaker = make_breaker(server.url, policy)
    assert breaker.call(lambda: "up") == "up"
    with pytest.raises(Boom):
        breaker.call(boom)
    assert breaker.snapshot()["consecutive_failures"] == 1

    server.stop()
    # A process that knew the breaker closed admits on that alone until it hears of the drop
    # (its watch thread) or the view ages out (the staleness bound, held by its own tests):
    # the policy is what it follows from then on.
    wait_for(
        lambda: breaker._knowledge.admits("dep") is None,
        "the process to stop trusting what it knew",
        timeout=MAX_KNOWLEDGE_AGE + 10.0,
    )
    assert_follows_policy(breaker, policy)
    assert outage_logs(caplog) == (1, 0)

    server.start()  # same port, empty (no persistence): a fresh closed breaker
    assert breaker.call(lambda: "back") == "back"
    assert breaker.call(lambda: "again") == "again"
    assert outage_logs(caplog) == (1, 1)
    # Shared state works again through the same Resilience: two failures trip the breaker.
    for _ in range(2):
        with pytest.raises(Boom):
            breaker.call(boom)
    assert breaker.state == "open"
    with pytest.raises(BreakerOpen) as info:
        breaker.call(lambda: None)
    assert info.value.state == "open"
    assert outage_logs(caplog) == (1, 1)


def test_a_permit_taken_before_redis_stopped_reports_without_raising(
    make_breaker: MakeBreaker, server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    breaker = make_breaker(server.url, "fail_open")
    permit = breaker.acquire()
    server.stop()
    _, elapsed = timed(permit.failure)
    assert elapsed < DECIDES_WITHIN
    assert outage_logs(caplog) == (1, 0)


def test_a_killed_redis_is_an_outage_too(make_breaker: MakeBreaker, server: RedisServer) -> None:
    breaker = make_breaker(server.url, "fail_closed")
    assert breaker.call(lambda: 1) == 1
    server.kill()
    # A process that knew the breaker closed hears the connection drop (at once, on its watch
    # thread) and asks Redis from then on.
    deadline = time.monotonic() + 2.0
    while breaker._knowledge.admits("dep") is not None:
        assert time.monotonic() < deadline, "the outage was never heard of"
        time.sleep(0.005)
    with pytest.raises(BreakerOpen, match="unavailable"):
        breaker.call(lambda: 1)
    server.start()
    assert breaker.call(lambda: 2) == 2


# -- the helper itself ----------------------------------------------------------------------------
def test_redis_server_with_appendonly_keeps_data_across_a_kill(tmp_path: Path) -> None:
    with RedisServer(appendonly=True) as server:
        client = server.client()
        client.set("k", "v")
        client.close()
        server.kill()
        assert not server.running
        server.start()
        client = server.client()
        assert client.get("k") == b"v"
        assert client.config_get("appendfsync") == {"appendfsync": "always"}
        client.close()


def test_redis_server_without_appendonly_starts_empty_after_a_stop() -> None:
    with RedisServer() as server:
        port = server.port
        client = server.client()
        client.set("k", "v")
        client.close()
        server.stop()
        server.start()
        assert server.port == port
        client = server.client()
        assert client.get("k") is None
        client.close()


# -- what a failed record must not lose, or do twice ------------------------------------------
def test_deferred_successes_survive_a_failure_record_that_errors(
    make_breaker: MakeBreaker, server: RedisServer
) -> None:
    breaker = make_breaker(server.url, "fail_open")
    deadline = time.monotonic() + 5.0
    while breaker._knowledge.admits("dep") is None:  # until the process knows the breaker
        assert time.monotonic() < deadline
        breaker.acquire().release()
        time.sleep(0.005)
    for _ in range(3):
        breaker.call(lambda: None)  # held back in this process (sent once a second)
    permit = breaker.acquire()
    server.stop()
    permit.failure()  # Redis is gone: this record fails; the 3 successes must not go with it
    server.start()
    breaker.flush()
    snap = breaker.snapshot()  # a fresh Redis: it holds exactly what was sent since
    assert (snap["window_calls"], snap["successes_total"]) == (3, 3)


def test_the_clock_falls_back_to_this_host_with_one_log_line(
    closed_port_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = Celery("t", broker=closed_port_url, set_as_current=False)
    app.conf.resilience_redis_timeout = TIMEOUT
    resilience = Resilience(app)
    caplog.set_level(logging.DEBUG, logger="celery_resilience")
    before = time.time()
    stamps = [resilience.runtime.now() for _ in range(3)]
    assert all(before <= t <= time.time() for t in stamps)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and "TIME" in r.msg]
    assert len(errors) == 1


def test_a_record_whose_reply_is_lost_is_not_sent_twice(
    make_breaker: MakeBreaker, server: RedisServer
) -> None:
    """The reply of a failure record is cut after Redis ran it: the client sees a connection
    error, and must not send the script again (the failure would count twice)."""
    from celery_resilience.redis_io import script_source
    from tests.support.faults import FaultProxy, script_sha

    admin = server.client()
    admin.script_load(
        script_source("celery_resilience.breaker", "record")
    )  # the EVALSHA that is cut runs at once
    admin.close()
    proxy = FaultProxy(server.port)
    try:
        breaker = make_breaker(f"redis://{proxy.url}/0", "fail_open")
        permit = breaker.acquire()
        cut = proxy.cut_reply_on(script_sha("breaker/lua/record.lua"))
        permit.failure()
        assert cut.is_set()
        snap = breaker.snapshot()
        assert (snap["failures_total"], snap["consecutive_failures"]) == (1, 1)
    finally:
        proxy.close()
