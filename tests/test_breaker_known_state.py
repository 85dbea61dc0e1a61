"""``Breaker.known_state()``, what a web page reads to say whether a payment goes through now:
the process's view, no round trip while the change feed keeps it current, on the real Redis."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery

from celery_resilience import Resilience
from celery_resilience.breaker import Breaker
from tests.support.round_trips import lasting_knowledge
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

MakeBreaker = Callable[..., Breaker]


@pytest.fixture
def make_breaker(redis_url: str, key_prefix: str) -> Iterator[MakeBreaker]:
    """A breaker ``dep`` of a fresh process-like ``Resilience`` on this test's prefix."""
    made: list[Resilience] = []

    def make(open_timeout: float = 30.0) -> Breaker:
        app = Celery("t", broker=redis_url, set_as_current=False)
        app.conf.resilience_key_prefix = key_prefix
        app.conf.resilience_redis_url = redis_url
        app.conf.resilience_breakers = {
            "dep": {"failure_threshold": 1, "open_timeout": open_timeout}
        }
        made.append(Resilience(app))
        return made[-1].breaker("dep")

    yield make
    for resilience in made:
        resilience.runtime.close()


class Scripts:
    """Breaker scripts one process sends (the shared server's own counts mix every client)."""

    def __init__(self, breaker: Breaker) -> None:
        client = breaker._store().client  # type: ignore[attr-defined]
        self.count = 0
        send = client.execute_command

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += str(args[0]).upper().startswith("EVAL")
            return send(*args, **kwargs)

        client.execute_command = counted


def learnt(breaker: Breaker) -> Breaker:
    """Ask until the view is learnt: the first answers come while the feed is not live yet."""
    deadline = time.monotonic() + 5.0
    while breaker.known_state() and breaker._knowledge.known(breaker.name) is None:
        assert time.monotonic() < deadline, "the view was never learnt"
        time.sleep(0.005)
    return breaker


def test_a_new_breaker_is_known_closed_and_then_costs_no_round_trip(
    make_breaker: MakeBreaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    lasting_knowledge(monkeypatch)
    breaker = make_breaker()
    assert breaker.known_state() == "closed"  # asked Redis: nothing known yet
    learnt(breaker)
    scripts = Scripts(breaker)
    assert [breaker.known_state() for _ in range(100)] == ["closed"] * 100
    assert scripts.count == 0


def test_a_page_process_hears_another_process_open_and_reset_the_breaker(
    make_breaker: MakeBreaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    lasting_knowledge(monkeypatch)
    page, worker = learnt(make_breaker()), make_breaker()
    scripts = Scripts(page)
    with pytest.raises(ConnectionError):
        worker.call(refuse)
    wait_for(lambda: page.known_state() == "open", "the page to know it open")
    worker.force_open()
    wait_for(lambda: page.known_state() == "forced_open", "the page to know it forced")
    worker.reset()
    wait_for(lambda: page.known_state() == "closed", "the page to know it closed")
    assert scripts.count == 0  # every answer came from the change feed


def test_an_open_breaker_past_its_timeout_reads_open_until_a_caller_asks_for_a_probe(
    make_breaker: MakeBreaker,
) -> None:
    page, worker = learnt(make_breaker(open_timeout=0.2)), make_breaker(open_timeout=0.2)
    with pytest.raises(ConnectionError):
        worker.call(refuse)
    wait_for(lambda: page.known_state() == "open", "the page to know it open")
    wait_for(lambda: page.state == "half_open", "a half-open snapshot")  # the timeout passed...
    assert page.known_state() == "open"  # ...the view holds what the scripts last changed
    assert worker.call(lambda: "probe") == "probe"  # the probe's success closes it
    wait_for(lambda: page.known_state() == "closed", "the page to know it closed")


def refuse() -> None:
    raise ConnectionError("refused")
