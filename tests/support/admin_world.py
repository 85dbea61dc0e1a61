"""The admin's world: a Celery app the admin finds (``CELERY_RESILIENCE_APP``), parking in Redis or
in the ``default`` test database (``RESILIENCE_TEST_DB``), a superuser's client, and how a person
acts on a page. Test modules import the fixtures they use by name.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from celery_resilience import ParkedTask, Resilience

from . import django_settings

TASK = "shop.charge"
APP: Celery | None = None  # CELERY_RESILIENCE_APP = "tests.support.admin_world:APP"
STORE_URL = "/admin/celery_resilience/storeentry/"
RECORD_URL = "/admin/celery_resilience/parkedtaskrecord/"
BREAKERS_URL = "/admin/celery_resilience/breaker/"
SENSITIVE = ("card_token",)
BREAKERS = {
    "payments": {"failure_threshold": 3, "open_timeout": 30.0},
    "search": {"max_concurrent_calls": 4},
}


def charge(order: int, note: str | None = None) -> int:
    return order


@pytest.fixture
def django_db(request: pytest.FixtureRequest) -> Iterator[None]:
    """The ``default`` test database, emptied of what the test made."""
    django_settings.ensure_test_database("default", request.config)
    yield
    from django.contrib.auth.models import User

    django_settings.clear("default")
    User.objects.all().delete()


def published(client: redis.Redis, queue: str) -> list[dict[str, Any]]:
    """Task messages waiting in ``queue`` (kombu's Redis list), as headers + args/kwargs."""
    found = []
    for raw in client.lrange(queue, 0, -1):
        message = json.loads(raw)
        args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
        found.append({**message["headers"], "args": args, "kwargs": kwargs})
    return found


@pytest.fixture
def make_admin_app(
    django_db: None, redis_url: str, key_prefix: str, queue: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[str], Resilience]]:
    """``make(store)``: the app the admin finds through ``CELERY_RESILIENCE_APP``, parking in
    ``store`` ("redis" or "django"), and its Resilience (``breakers``: other breakers than
    ``BREAKERS``)."""
    from django.test import override_settings

    made: list[Resilience] = []

    def make(
        store: str, redis_at: str = redis_url, breakers: dict[str, Any] | None = None
    ) -> Resilience:
        app = Celery("admin-test", broker=redis_url, set_as_current=False)
        app.conf.task_default_queue = queue
        app.conf.resilience_redis_url = redis_at
        app.conf.resilience_key_prefix = key_prefix
        app.conf.resilience_backout_store = store
        app.conf.resilience_breakers = BREAKERS if breakers is None else breakers
        app.conf.resilience_sensitive_keys = SENSITIVE
        app.task(name=TASK, shared=False)(charge)
        monkeypatch.setattr(f"{__name__}.APP", app)
        made.append(Resilience.install(app, Resilience(app)))
        return made[-1]

    with override_settings(CELERY_RESILIENCE_APP=f"{__name__}:APP"):
        yield make
    for instance in made:
        instance.runtime.close()
        instance.runtime.app.close()


@pytest.fixture(params=["redis", "django"])
def resilience(
    request: pytest.FixtureRequest, make_admin_app: Callable[[str], Resilience]
) -> Resilience:
    """An app on each kind of store, Redis and the database."""
    return make_admin_app(request.param)


@pytest.fixture
def db_resilience(make_admin_app: Callable[[str], Resilience]) -> Resilience:
    return make_admin_app("django")


@pytest.fixture
def admin_client(django_db: None) -> Any:
    from django.contrib.auth.models import User
    from django.test import Client

    user = User.objects.create_superuser("boss", "boss@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client


def park(resilience: Resilience, n: int, *, id: str | None = None, **fields: Any) -> ParkedTask:
    """Park entry ``n``; ``id`` replaces the fresh uuid4 where a test needs to know its start."""
    values: dict[str, Any] = {
        "task_name": TASK,
        "task_id": f"order-{n}-{uuid.uuid4().hex[:6]}",
        "reason": "breaker_open",
        "breaker": "payments",
        "args": [n],
        "kwargs": {"note": f"note-{n}"},
        "options": {"time_limit": 60},
        "exc_type": "builtins.ConnectionError",
        "exc_message": f"gateway refused {n}",
        "traceback": f"Traceback (most recent call last):\n  frame-{n}\nConnectionError\n",
        "parked_at": 1_700_000_000.0 + n,
    }
    values.update(fields)
    entry = ParkedTask.new(**values)
    if id is not None:
        entry = dataclasses.replace(entry, id=id)
    resilience.runtime.backout_store.park(entry)
    return entry


def text(response: Any) -> str:
    assert response.status_code == 200, response.status_code
    return str(response.content.decode())


def act(
    client: Any,
    url: str,
    action: str,
    ids: list[str] | str | None = None,
    reason: str = "",
    across: bool = False,
) -> Any:
    """Run an action as a person does: ask (the confirmation page, which changes nothing),
    then confirm with its POST; the final response, redirects followed."""
    fields: dict[str, Any] = {"action": action, "_selected_action": ids or [], "index": "0"}
    if across:
        fields["select_across"] = "1"
    asked = client.post(url, fields)
    if asked.status_code != 200:  # no confirmation page: a message and back to the list
        return client.get(asked["Location"]) if asked.status_code == 302 else asked
    assert 'id="confirm-form"' in text(asked), text(asked)
    return client.post(url, {**fields, "post": "yes", "reason": reason}, follow=True)


def row_of(page: str, breaker: str) -> dict[str, str]:
    """The text of each cell of the breaker's row, by field name."""
    found = re.search(rf'<tr data-breaker="{re.escape(breaker)}">(.*?)</tr>', page, re.S)
    assert found, f"no row for breaker {breaker!r}"
    cells = re.findall(r'<t[dh] class="field-([a-z_]+)[^"]*"[^>]*>(.*?)</t[dh]>', found[1], re.S)
    return {name: re.sub(r"<[^>]+>", "", html).strip() for name, html in cells}
