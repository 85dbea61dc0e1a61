"""Forged and altered entries are never published: by the drain, by a replay on demand.

Entries are written straight into the store's Redis keys or database table, as someone with
write access to them would; the drain publishes into the real Redis broker, whose queue is read
back (``tests/support/drain_world.py``). The database store runs on PostgreSQL.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from celery import Celery

from celery_resilience import ParkedTask, Resilience
from celery_resilience.backout import Codec, Filter
from celery_resilience.metrics import ResilienceCollector
from tests.support import django_settings
from tests.support.drain_world import TASK, charge, drain_setup, sent, sent_ids
from tests.support.raw_entries import put_raw
from tests.support.resilience import AppSetup, MakeResilience

pytestmark = pytest.mark.integration


@pytest.fixture
def app_setup(queue: str) -> AppSetup:
    """The drain's world: apps with the test's own queue and ``TASK``."""
    return drain_setup(queue)


KEY = "drain-signing-key-" + "x" * 20
FORGER_KEY = "not-the-key-" + "y" * 20
#: When the entries were parked: a minute ago, well within their lifetime.
NOW = time.time() - 60


def task_entry(n: int, **fields: Any) -> ParkedTask:
    values: dict[str, Any] = {
        "task_name": TASK,
        "task_id": f"trust-{n}",
        "reason": "breaker_open",
        "args": [n],
        "parked_at": NOW + n,
        "due_at": NOW + n,
    }
    values.update(fields)
    return ParkedTask.new(**values)


def put(store: Any, e: ParkedTask, data: bytes) -> None:
    """Bytes written straight into the store under ``e``'s id, with a park's meta."""
    put_raw(store, e.id, data, breaker=e.breaker, reason=e.reason, parked_at=e.parked_at)


def forge(store: Any) -> dict[str, str]:
    """One real entry and three forgeries of it in ``store``; their ids by kind. The one signed
    with a key of the forger's own names that key: it is held, never published nor killed."""
    real = task_entry(1)
    store.park(real)
    unsigned, foreign, altered = task_entry(2), task_entry(3), task_entry(4, args=[4])
    put(store, unsigned, Codec("json").encode(unsigned))
    put(store, foreign, Codec("json", (FORGER_KEY,)).encode(foreign))
    genuine = store.codec.encode(altered)
    put(store, altered, genuine.replace(b'"args": [4]', b'"args": [666]'))
    return {"real": real.id, "unsigned": unsigned.id, "foreign": foreign.id, "altered": altered.id}


def assert_only_the_real_one_went_out(res: Resilience, ids: dict[str, str], queue: str) -> None:
    report = res.drain()
    assert (report.replayed, report.dead, report.held) == (1, 2, 1)
    store = res.runtime.backout_store
    dead = {e.id: e.dead_reason for e in store.list(Filter(status="dead"))}
    assert dead == {ids["unsigned"]: "unsigned", ids["altered"]: "tampered"}
    assert [e.id for e in store.list(Filter(status="parked"))] == [ids["foreign"]]
    stats = store.stats()
    assert (stats["dead_reason|-|tampered"], stats["dead_reason|-|unsigned"]) == (1, 1)


def test_the_drain_publishes_no_forged_entry_from_redis(
    make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    res = make_resilience(signing_key=KEY)
    ids = forge(res.runtime.backout_store)
    assert_only_the_real_one_went_out(res, ids, queue)
    assert sent_ids(redis_client, queue) == ["trust-1"]
    assert [s.args for s in sent(redis_client, queue)] == [[1]]
    families = {f.name: f for f in ResilienceCollector(res).collect()}
    samples = {
        (s.labels["reason"], s.value)
        for s in families["celery_resilience_dead_by_reason"].samples
        if s.name.endswith("_total")
    }
    assert samples == {("tampered", 1.0), ("unsigned", 1.0)}


def test_the_drain_publishes_no_forged_entry_from_the_database(
    request: pytest.FixtureRequest, redis_url: str, redis_client: redis.Redis, key_prefix: str,
    queue: str,
) -> None:  # fmt: skip
    from celery_resilience.contrib.django.store import DjangoBackoutStore

    django_settings.ensure_test_database("postgresql", request.config)
    django_settings.clear("postgresql")
    request.addfinalizer(lambda: django_settings.clear("postgresql"))
    app = Celery("trust-test", broker=redis_url, set_as_current=False)
    app.conf.task_default_queue = queue
    app.conf.resilience_key_prefix = key_prefix
    app.conf.resilience_drain_rate = 10_000.0
    app.conf.resilience_signing_key = KEY
    app.task(name=TASK, shared=False)(charge)
    store = DjangoBackoutStore(using="postgresql", codec=Codec("json", (KEY,)))
    res = Resilience(app, backout=store)
    try:
        ids = forge(store)
        assert_only_the_real_one_went_out(res, ids, queue)
        assert sent_ids(redis_client, queue) == ["trust-1"]
    finally:
        res.runtime.close()
        app.close()


def test_an_entry_moved_under_another_breaker_is_quarantined(
    make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    """Its own breaker is open; someone moved it into a closed one's ready set and meta."""
    res = make_resilience(signing_key=KEY)
    res.breaker("payments").force_open()
    store = res.runtime.backout_store
    e = task_entry(1, breaker="payments")
    store.park(e)
    keys = store.keys  # type: ignore[attr-defined]
    redis_client.zrem(keys.ready("payments"), e.id)
    redis_client.zadd(keys.ready("other"), {e.id: 0})
    redis_client.hset(keys.meta, e.id, "parked|breaker_open||other")
    redis_client.hincrby(keys.counts, "parked|other", 1)
    report = res.drain(breaker="other")
    assert (report.replayed, report.dead) == (0, 1)
    assert sent_ids(redis_client, queue) == []
    assert store.get(e.id).dead_reason == "tampered"  # type: ignore[union-attr]


def test_a_replay_on_demand_refuses_and_quarantines_a_forged_entry(
    make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    res = make_resilience(signing_key=KEY)
    forged = task_entry(1)
    put(res.runtime.backout_store, forged, Codec("json").encode(forged))
    with pytest.raises(ValueError, match="trusted"):
        res.backout.replay(forged.id)
    assert sent_ids(redis_client, queue) == []
    got = res.backout.get(forged.id)
    assert got is not None
    assert got.status == "dead"
    assert res.backout.count(status="dead") == 1  # quarantined in the store, not just shown


def test_a_drainer_without_the_encryption_key_publishes_nothing(
    make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    from cryptography.fernet import Fernet

    key = Fernet.generate_key().decode()
    parker = make_resilience(encryption_key=key)
    parker.runtime.backout_store.park(task_entry(1))
    blind = make_resilience()  # same store, no key
    report = blind.drain()
    assert (report.replayed, report.dead, report.held) == (0, 0, 1)
    assert sent_ids(redis_client, queue) == []
    entry = blind.backout.list()[0]  # held for a process with the key, never dead
    assert (entry.encrypted, entry.status, entry.dead_reason) == (True, "parked", None)
    assert entry.held == "sealed, and this process has no encryption key"
    with pytest.raises(ValueError, match="held: sealed"):
        blind.backout.replay(entry.id)
    assert parker.backout.replay(entry.id).args == [1]  # with the key, a person can send it
    assert sent_ids(redis_client, queue) == ["trust-1"]
