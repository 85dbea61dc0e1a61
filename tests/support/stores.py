"""The back-out store contract's world: a store of each backend (``make_store``, a fixture of
the whole suite that ``conftest.py`` loads as a plugin: memory, Redis, and the database store on
SQLite and on PostgreSQL), a typical entry, and an entry's stored bytes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from celery_resilience.backout import MemoryBackoutStore, ParkedTask, RedisBackoutStore

Store = MemoryBackoutStore | RedisBackoutStore
MakeStore = Callable[..., Store]

T0 = 1_700_000_000.0


def entry(n: int = 0, **fields: Any) -> ParkedTask:
    values: dict[str, Any] = {
        "task_name": "shop.charge",
        "task_id": f"task-{n}",
        "args": [n, "naïve ☃", {"nested": [1, {"k": None}], "t": [True, 2.5]}],
        "kwargs": {"order": f"A-{n}", "lines": [{"sku": "é", "qty": 2}]},
        "options": {"queue": "payments", "routing_key": "pay", "priority": 3, "headers": {}},
        "breaker": "payments",
        "reason": "breaker_open",
        "exc_type": "builtins.ConnectionError",
        "exc_message": "refused",
        "traceback": "Traceback...",
        "retries": 2,
        "parked_at": T0 + n,
        "due_at": T0 + n + 30,
    }
    values.update(fields)
    return ParkedTask.new(**values)


@pytest.fixture(params=["memory", "redis", "django", "django-postgresql"])
def make_store(request: pytest.FixtureRequest) -> MakeStore:
    """Builds a store of the parametrized kind; several per test share one Redis prefix."""
    if request.param == "memory":
        return MemoryBackoutStore
    if request.param.startswith("django"):  # the ORM store on SQLite, or on PostgreSQL
        from tests.support.django_settings import contract_store_factory

        return contract_store_factory(request)  # type: ignore[return-value]
    client: redis.Redis = request.getfixturevalue("redis_client")
    prefix: str = request.getfixturevalue("key_prefix")
    made = 0

    def make(**options: Any) -> Store:
        nonlocal made
        made += 1
        return RedisBackoutStore(client, f"{prefix}-{made}", **options)

    return make


def raw(store: Store, entry_id: str) -> bytes | None:
    if isinstance(store, RedisBackoutStore):
        return store.client.hget(store.keys.entries, entry_id)  # type: ignore[return-value]
    record = store._records.get(entry_id)
    return None if record is None else record.data
