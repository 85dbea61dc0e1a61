"""The database back-out store beyond the shared contract: the drain's side, concurrency, set-up.

The contract itself (park, list, purge, dead entries...) runs in ``tests/test_backout_store.py``
for the ``django`` and ``django-postgresql`` params. Here each test runs on SQLite and on
PostgreSQL (skipped only when the server is unreachable), in test databases of our own.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from celery_resilience import ParkedTask, Resilience
from celery_resilience.backout import Filter
from celery_resilience.backout.entry import UNDECODABLE_TASK
from celery_resilience.contrib.django.store import DjangoBackoutStore, make_store
from celery_resilience.errors import ConfigurationError, StoreUnavailable
from tests.support import django_settings
from tests.support.raw_entries import put_raw

pytestmark = pytest.mark.integration

TASK = "store_test.charge"


def charge(order: int) -> int:
    return order


@pytest.fixture(params=["sqlite", "postgresql"])
def alias(request: pytest.FixtureRequest) -> Iterator[str]:
    """A database alias whose test database is empty at the start and the end of the test."""
    name = str(request.param)
    django_settings.ensure_test_database(name, request.config)
    django_settings.clear(name)
    yield name
    django_settings.clear(name)


@pytest.fixture
def store(alias: str) -> DjangoBackoutStore:
    return DjangoBackoutStore(using=alias)


def entry(n: int, due_at: float, breaker: str | None = "b", **fields: Any) -> ParkedTask:
    return ParkedTask.new(
        task_name=TASK,
        task_id=f"task-{n}",
        reason="breaker_open",
        breaker=breaker,
        args=[n],
        parked_at=due_at - 10,
        due_at=due_at,
        **fields,
    )


def in_threads(count: int, work: Callable[[int], None]) -> None:
    """Run ``work(i)`` in ``count`` threads; each closes its own database connections."""
    from django.db import connections

    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            work(i)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


# -- claim, ack, release -------------------------------------------------------------------


def test_claim_leases_due_entries_oldest_due_first(store: DjangoBackoutStore) -> None:
    now = time.time()
    late, early, future = entry(1, now - 1), entry(2, now - 5), entry(3, now + 100)
    for e in (late, early, future):
        store.park(e)
    assert store.due("b", now) == 2
    claimed = store.claim("b", 10, lease=60, now=now)
    assert [c.id for c in claimed] == [early.id, late.id]
    assert claimed[0] == early
    assert store.due("b", now) == 0
    assert store.in_flight() == 2
    assert store.claim("b", 10, lease=60, now=now) == []
    # Claimed entries still read as parked, and come back when the lease ends.
    assert store.count(Filter(status="parked")) == 3
    assert store.get(early.id) == early
    again = store.claim("b", 10, lease=60, now=now + 61)
    assert {c.id for c in again} == {early.id, late.id}


def test_claim_respects_limit_breaker_and_status(store: DjangoBackoutStore) -> None:
    now = time.time()
    mine = [entry(n, now - 10 + n) for n in range(5)]
    other, bare = entry(10, now - 20, breaker="other"), entry(11, now - 20, breaker=None)
    for e in (*mine, other, bare):
        store.park(e)
    store.mark_dead(mine[0].id, "max_replays")
    assert store.claim("b", 0, lease=60) == []
    assert [c.id for c in store.claim("b", 2, lease=60)] == [mine[1].id, mine[2].id]
    assert [c.id for c in store.claim("-", 5, lease=60)] == [bare.id]
    assert store.due("b") == 2
    assert store.due("other") == 1


def test_ack_removes_claimed_entries(store: DjangoBackoutStore) -> None:
    now = time.time()
    entries = [entry(n, now - 1) for n in range(3)]
    for e in entries:
        store.park(e)
    claimed = store.claim("b", 2, lease=60)
    assert store.ack("b", [c.id for c in claimed]) == 2
    assert store.ack("b", [c.id for c in claimed]) == 0
    assert store.count() == 1
    assert store.in_flight() == 0


def test_give_back_returns_claimed_entries_unreplayed(store: DjangoBackoutStore) -> None:
    now = time.time()
    entries = [entry(n, now - 1) for n in range(3)]
    for e in entries:
        store.park(e)
    claimed = [c.id for c in store.claim("b", 2, lease=60)]
    assert store.give_back("b", [*claimed, entries[2].id, "never-there"], now + 30) == 2
    assert store.in_flight() == 0
    assert store.due("b", now) == 1  # the one never claimed
    assert store.due("b", now + 31) == 3
    assert store.give_back("b", claimed, now) == 0  # given back already


def test_mark_dead_ends_a_lease(store: DjangoBackoutStore) -> None:
    e = entry(1, time.time() - 1)
    store.park(e)
    store.claim("b", 1, lease=60)
    assert store.mark_dead(e.id, "max_replays")
    assert store.in_flight() == 0
    assert store.claim("b", 1, lease=60, now=time.time() + 120) == []


def test_claim_returns_undecodable_entries_as_placeholders(store: DjangoBackoutStore) -> None:
    put_raw(store, "raw-1", b"\x00garbage", breaker="b", parked_at=time.time() - 1)
    [placeholder] = store.claim("b", 5, lease=60)
    assert (placeholder.id, placeholder.task_name) == ("raw-1", UNDECODABLE_TASK)
    assert placeholder.dead_reason == "undecodable"


def test_concurrent_claimers_never_share_an_entry(store: DjangoBackoutStore) -> None:
    now = time.time()
    entries = [entry(n, now - 1) for n in range(120)]
    for e in entries:
        store.park(e)
    claims: list[list[str]] = [[] for _ in range(4)]

    def drain(i: int) -> None:
        while batch := store.claim("b", 7, lease=60):
            claims[i] += [c.id for c in batch]

    in_threads(4, drain)
    every = [i for claim in claims for i in claim]
    assert sorted(every) == sorted(e.id for e in entries)  # each exactly once


# Row locks are PostgreSQL's: on SQLite claims are serialized by the write lock instead.
@pytest.mark.parametrize("alias", ["postgresql"], indirect=True)
def test_a_claim_skips_rows_another_claim_holds(store: DjangoBackoutStore, alias: str) -> None:
    from django.db import transaction

    now = time.time()
    for n in range(10):
        store.park(entry(n, now - 20 + n))
    held, release = threading.Event(), threading.Event()
    first: list[str] = []

    def slow_claim(_: int) -> None:
        with transaction.atomic(using=alias):
            first.extend(c.id for c in store.claim("b", 5, lease=60))
            held.set()
            release.wait(30)

    worker = threading.Thread(target=in_threads, args=(1, slow_claim))
    worker.start()
    assert held.wait(30)
    started = time.monotonic()
    second = [c.id for c in store.claim("b", 10, lease=60)]
    took = time.monotonic() - started
    release.set()
    worker.join(30)
    assert took < 10.0  # skipped the locked rows instead of waiting 30 s for them
    assert len(first) == len(second) == 5
    assert not set(first) & set(second)


# -- counters --------------------------------------------------------------------------------


def test_bump_adds_up_under_concurrency(store: DjangoBackoutStore) -> None:
    store.park(entry(1, time.time()))

    def bump(_: int) -> None:
        for _ in range(25):
            store.bump({"drain_runs": 1, "drain_seconds": 0.5})

    in_threads(4, bump)
    stats = store.stats()
    assert stats["drain_runs"] == 100
    assert stats["drain_seconds"] == 50
    assert stats["parked|b|breaker_open"] == 1
    assert not [name for name in stats if name.startswith("lock|")]  # locks are not counters


# -- set-up ----------------------------------------------------------------------------------


def test_database_trouble_is_store_unavailable(alias: str) -> None:
    from django.db import connections

    broken = dict(connections.settings[alias])
    broken.update(NAME="/nonexistent/folder/resilience.sqlite3", PORT=1, TEST={})
    connections.settings["broken"] = broken
    try:
        store = DjangoBackoutStore(using="broken")
        with pytest.raises(StoreUnavailable, match="unreachable"):
            store.park(entry(1, time.time()))
        with pytest.raises(StoreUnavailable):
            store.count()
    finally:
        connections["broken"].close()
        del connections["broken"]
        del connections.settings["broken"]


def test_the_store_needs_the_app_installed(alias: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from django.apps import apps

    monkeypatch.setattr(apps, "is_installed", lambda name: False)
    with pytest.raises(ConfigurationError, match="INSTALLED_APPS"):
        DjangoBackoutStore(using=alias)


def test_make_store_takes_the_apps_settings(alias: str) -> None:
    app = Celery("store-test", broker="memory://", set_as_current=False)
    app.conf.accept_content = ["json", "pickle"]
    app.conf.resilience_serializer = "pickle"
    app.conf.resilience_signing_key = "django-store-signing-key-" + "s" * 16
    app.conf.resilience_backout_max_entries = 5
    app.conf.resilience_dead_ttl = 60.0
    store = make_store(Resilience(app).runtime)
    assert (store.serializer, store.max_entries, store.dead_ttl) == ("pickle", 5, 60.0)
    assert store.using == "default"
    assert "pickle" in store.codec.readable
    app.close()


@pytest.fixture
def queue(redis_client: redis.Redis) -> Iterator[str]:
    name = f"django-store-test-{uuid.uuid4().hex[:12]}"
    yield name
    redis_client.delete(name, f"_kombu.binding.{name}")


def test_an_app_on_the_django_store_drains_from_the_database(
    request: pytest.FixtureRequest,
    redis_url: str,
    redis_client: redis.Redis,
    key_prefix: str,
    queue: str,
) -> None:
    django_settings.ensure_test_database("default", request.config)
    django_settings.clear("default")
    request.addfinalizer(lambda: django_settings.clear("default"))
    app = Celery("drain-test", broker=redis_url, set_as_current=False)
    app.conf.task_default_queue = queue
    app.conf.resilience_redis_url = redis_url
    app.conf.resilience_key_prefix = key_prefix
    app.conf.resilience_backout_store = "django"
    app.conf.resilience_drain_rate = 10_000.0
    app.task(name=TASK, shared=False)(charge)
    resilience = Resilience(app)
    try:
        store = resilience.runtime.backout_store
        assert isinstance(store, DjangoBackoutStore)
        entries = [entry(n, time.time() - 1, breaker=None) for n in range(3)]
        for e in entries:
            store.park(e)
        report = resilience.drain()
        assert (report.replayed, report.dead, report.errors) == (3, 0, 0)
        assert store.count() == 0
        assert store.stats()["replayed|-"] == 3
        sent = [json.loads(raw) for raw in redis_client.lrange(queue, 0, -1)]
        assert sorted(m["headers"]["id"] for m in sent) == sorted(e.task_id for e in entries)
        args = sorted(json.loads(base64.b64decode(m["body"]))[0][0] for m in sent)
        assert args == [0, 1, 2]
    finally:
        resilience.runtime.close()
        app.close()
