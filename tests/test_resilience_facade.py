"""``Resilience``: one per app, over the app's one runtime, and nothing but the public contract.

The registry of ``runtime.py`` is the only map from an app to its per-app object: the facade
holds a runtime and nothing else, so ``Resilience.for_app(app)`` and the app's tasks always
agree on the breakers and the store, also after ``Resilience.install``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_resilience import ConfigurationError, Resilience, ResilientTask
from celery_resilience import runtime as runtimes
from celery_resilience.breaker import MemoryBreakerStore
from celery_resilience.runtime import Runtime

pytestmark = pytest.mark.unit

API = Path(__file__).resolve().parent.parent / "docs" / "api.rst"
#: The facade's public contract (the API reference, and "One object per app" on the design
#: page), with ``drain_once`` and ``install`` that the docs show, and ``runtime``: the one door
#: to the internals.
PUBLIC = {"for_app", "install", "breaker", "backout", "drain", "drain_once", "replay"}
PUBLIC |= {"beat_schedule", "runtime"}


def make_app(**settings: Any) -> Celery:
    app = Celery("facade", broker="memory://", set_as_current=False)
    app.conf.task_always_eager = True
    for name, value in settings.items():
        app.conf[f"resilience_{name}"] = value
    return app


def documented_members() -> set[str]:
    text = API.read_text()
    block = re.search(r"autoclass:: Resilience\n\s+:members:(.*?)\n\n", text, re.S)
    assert block is not None, "docs/api.rst documents Resilience's members"
    return {name.strip() for name in block.group(1).replace("\n", " ").split(",")}


def test_the_facade_offers_only_the_public_contract() -> None:
    public = {name for name in dir(Resilience) if not name.startswith("_")}

    assert public == PUBLIC
    assert documented_members() == PUBLIC - {"runtime"}  # internals are no promise


def test_for_app_is_the_apps_one_object_over_its_one_runtime() -> None:
    app, other = make_app(), make_app()

    first, again = Resilience.for_app(app), Resilience.for_app(app)

    assert first == again
    assert hash(first) == hash(again)
    assert first.runtime is again.runtime is Runtime.for_app(app)
    assert Resilience.for_app(other) != first
    assert Resilience.for_app(other).runtime is not first.runtime


def test_a_bad_setting_fails_on_first_use_and_registers_nothing() -> None:
    app = make_app(drain_batch=0)

    with pytest.raises(ConfigurationError, match="resilience_drain_batch"):
        Resilience.for_app(app)

    assert runtimes.installed(app) is None


def test_an_installed_instance_is_the_one_the_apps_tasks_use() -> None:
    app = make_app(breakers={"payments": {"failure_threshold": 1}})
    calls: list[int] = []

    @app.task(base=ResilientTask, bind=True, breaker="payments", shared=False)
    def charge(self: Any, order_id: int) -> None:
        calls.append(order_id)

    Resilience.for_app(app)  # the app had one already: install replaces it
    clock = {"now": 1_700_000_000_000_000}
    mine = Resilience(app, breaker_store=MemoryBreakerStore(clock=lambda: clock["now"]))
    assert Resilience.install(app, mine) is mine

    mine.breaker("payments").force_open()
    charge.delay(7)

    assert calls == []  # the task saw the installed breaker, open
    [entry] = mine.backout.list(breaker="payments")
    assert entry.args == [7]
    assert entry.reason == "breaker_open"
    assert Resilience.for_app(app) == mine
    assert Runtime.for_app(app) is mine.runtime


def test_an_instance_made_for_another_app_is_refused() -> None:
    app, other = make_app(), make_app()
    own = Resilience.for_app(app)

    with pytest.raises(ValueError, match="made for"):
        Resilience.install(app, Resilience(other))

    assert Resilience.for_app(app) == own


def test_an_instance_not_installed_is_not_the_apps() -> None:
    app = make_app()

    aside = Resilience(app)
    aside.breaker("payments").force_open()

    assert Resilience.for_app(app) != aside
    assert Resilience.for_app(app).breaker("payments").state == "closed"
