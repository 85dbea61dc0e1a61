"""``celery_resilience.signals.task_parked`` tells an app that a task was parked."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_resilience import Resilience, ResilientTask
from celery_resilience.signals import task_parked

pytestmark = pytest.mark.unit


def test_task_parked_is_sent_once_with_the_stored_entry() -> None:
    app = Celery("signals", broker="memory://", set_as_current=False)
    app.conf.task_always_eager = True

    @app.task(base=ResilientTask, park_on=(LookupError,), shared=False)
    def ship(order: int) -> None:
        raise LookupError("not in stock")

    seen: list[tuple[Any, Any]] = []

    def on_parked(sender: Any = None, entry: Any = None, **_: Any) -> None:
        seen.append((sender, entry))

    task_parked.connect(on_parked, weak=False)
    try:
        ship.apply((5,))
    finally:
        task_parked.disconnect(on_parked)

    [(sender, entry)] = seen
    assert sender.name == ship.name
    assert (entry.reason, entry.args) == ("park_on", [5])
    assert Resilience.for_app(app).backout.get(entry.id) == entry


def test_a_failing_handler_changes_nothing() -> None:
    app = Celery("signals2", broker="memory://", set_as_current=False)
    app.conf.task_always_eager = True

    @app.task(base=ResilientTask, park_on=(LookupError,), shared=False)
    def ship(order: int) -> None:
        raise LookupError("not in stock")

    def broken(**_: Any) -> None:
        raise RuntimeError("handler bug")

    task_parked.connect(broken, weak=False)
    try:
        result = ship.apply((5,))
    finally:
        task_parked.disconnect(broken)

    assert result.state == "IGNORED"
    assert Resilience.for_app(app).backout.count() == 1
