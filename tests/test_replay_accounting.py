"""Replays the breaker turns away unrun do not use up ``resilience_max_replays``."""

from __future__ import annotations

import time
from typing import Any

import pytest
from celery import Celery

from celery_resilience import Resilience, ResilientTask
from celery_resilience.headers import REJECTED_HEADER, REPLAYS_HEADER

pytestmark = pytest.mark.unit


def make_app(**settings: Any) -> tuple[Celery, Any, list[int]]:
    app = Celery("accounting", broker="memory://", set_as_current=False)
    app.conf.task_always_eager = True
    app.conf.resilience_breakers = {"dep": {"failure_threshold": 1, "open_timeout": 60.0}}
    for name, value in settings.items():
        app.conf[f"resilience_{name}"] = value
    calls: list[int] = []

    @app.task(base=ResilientTask, bind=True, breaker="dep", shared=False)
    def charge(self: Any, order: int) -> int:
        calls.append(order)
        return order

    return app, charge, calls


def test_a_replay_turned_away_by_the_breaker_is_counted_as_rejected() -> None:
    app, charge, calls = make_app()
    resilience = Resilience.for_app(app)
    resilience.breaker("dep").force_open()

    charge.apply((1,), headers={REPLAYS_HEADER: 2, REJECTED_HEADER: 1})

    [entry] = resilience.backout.list()
    assert (entry.reason, entry.replays) == ("breaker_open", 2)
    assert entry.options["headers"][REJECTED_HEADER] == 2
    assert calls == []


def test_a_first_delivery_turned_away_is_not_a_rejected_replay() -> None:
    app, charge, _ = make_app()
    resilience = Resilience.for_app(app)
    resilience.breaker("dep").force_open()

    charge.apply((1,))

    [entry] = resilience.backout.list()
    assert REJECTED_HEADER not in (entry.options.get("headers") or {})


def test_rejected_replays_do_not_make_an_entry_dead() -> None:
    app, charge, calls = make_app(max_replays=2)
    resilience = Resilience.for_app(app)
    resilience.breaker("dep").force_open()
    charge.apply((7,), headers={REPLAYS_HEADER: 3, REJECTED_HEADER: 2})  # 3 replays, 1 ran

    resilience.breaker("dep").reset()
    report = resilience.drain()

    assert (report.replayed, report.dead) == (1, 0)
    assert calls == [7]


def test_replays_that_ran_make_an_entry_dead_past_the_limit() -> None:
    app = Celery("accounting", broker="memory://", set_as_current=False)
    app.conf.task_always_eager = True
    app.conf.resilience_max_replays = 2
    app.conf.resilience_park_on_delay = 0.001  # due again at once: the replay limit decides

    @app.task(base=ResilientTask, park_on=(LookupError,), shared=False)
    def ship(order: int) -> None:
        raise LookupError("not in stock yet")

    ship.apply((7,), headers={REPLAYS_HEADER: 2})  # ran on both replays, parked each time
    time.sleep(0.01)
    report = Resilience.for_app(app).drain()

    assert (report.replayed, report.dead) == (0, 1)
    assert Resilience.for_app(app).backout.list()[0].dead_reason == "max_replays"
