"""Counts by reason in the Redis store: O(1) from counters that stay exact, or not used at all.

Every check compares with the truth read from the metadata itself (``truth``), for every
combination of reason, status and breaker the entries use.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from typing import Any

import pytest
import redis

from celery_resilience.backout import NO_BREAKER, Filter, ParkedTask, RedisBackoutStore
from celery_resilience.backout.entry import REASONS
from celery_resilience.backout.store import Meta
from tests.support.stores import T0, entry

pytestmark = pytest.mark.integration

BREAKERS = ("payments", "mail", NO_BREAKER)


@pytest.fixture
def store(redis_client: redis.Redis, key_prefix: str) -> RedisBackoutStore:
    return RedisBackoutStore(redis_client, key_prefix, dead_ttl=0.2)


def an_entry(n: int, **fields: Any) -> ParkedTask:
    """Entry ``n``: its breaker and reason cycle through every kind."""
    breaker = BREAKERS[n % 3]
    values: dict[str, Any] = {
        "breaker": None if breaker == NO_BREAKER else breaker,
        "reason": REASONS[n % len(REASONS)],
    }
    return entry(n, **{**values, **fields})


def filters() -> list[Filter]:
    """Every filter with a reason: alone, with a status, a breaker, or both."""
    return [
        Filter(breaker, status, reason)
        for reason in REASONS
        for status in (None, "parked", "dead")
        for breaker in (None, *BREAKERS)
    ]


def truth(store: RedisBackoutStore, where: Filter) -> int:
    metas = store.client.hgetall(store.keys.meta)
    return sum(1 for m in metas.values() if where.matches(Meta.decode(m)))


def assert_exact(store: RedisBackoutStore) -> None:
    """The counters are complete and trusted, and every count by reason is the truth."""
    assert store.reason_counters() is not None
    for where in filters():
        assert store.count(where) == truth(store, where), where


def forget_counters(store: RedisBackoutStore) -> None:
    """The store as a release without reason counters left it."""
    store.client.delete(store.keys.reasons)


def older_release_park(store: RedisBackoutStore, e: ParkedTask) -> None:
    """What ``park.lua`` of a release without reason counters writes."""
    k, meta = store.keys, Meta.of(e)
    with store.client.pipeline(transaction=True) as pipe:
        pipe.hset(k.entries, e.id, store.codec.encode(e))
        pipe.zadd(k.index, {e.id: e.parked_at})
        pipe.hset(k.meta, e.id, meta.encode())
        pipe.hincrby(k.counts, meta.counter, 1)
        pipe.hincrby(k.stats, f"parked|{meta.breaker}|{meta.reason}", 1)
        pipe.zadd(k.ready(meta.breaker), {e.id: e.due_at})
        pipe.execute()


def older_release_delete(store: RedisBackoutStore, e: ParkedTask) -> None:
    """What ``delete.lua`` of a release without reason counters does to one parked entry."""
    k, meta = store.keys, Meta.of(e)
    with store.client.pipeline(transaction=True) as pipe:
        pipe.hdel(k.entries, e.id)
        pipe.hdel(k.meta, e.id)
        pipe.zrem(k.index, e.id)
        pipe.zrem(k.ready(meta.breaker), e.id)
        pipe.hincrby(k.counts, meta.counter, -1)
        pipe.execute()


def test_a_new_store_counts_by_reason_from_its_first_park(store: RedisBackoutStore) -> None:
    store.park(an_entry(0))
    assert store.client.hget(store.keys.reasons, "~counted") == b"all"
    assert_exact(store)


def test_counts_by_reason_stay_exact_through_every_change(store: RedisBackoutStore) -> None:
    entries = [an_entry(n) for n in range(30)]
    for e in entries:
        store.park(e)
    assert_exact(store)
    # given parked entries, when each is parked again (the same id), then nothing changes
    for e in entries[:10]:
        store.park(e)
    assert_exact(store)
    # mark dead, delete, a drain's claim then release, and ack
    assert store.mark_dead(entries[0].id, "max_replays")
    assert not store.mark_dead(entries[0].id, "max_replays")
    assert store.mark_dead(entries[4].id, "unregistered")
    assert store.delete(entries[1].id)
    assert not store.delete(entries[1].id)
    assert_exact(store)
    claimed = store.claim("payments", 3, 60.0, now=2e9)
    assert claimed
    assert store.give_back("payments", [c.id for c in claimed], T0) == len(claimed)
    assert_exact(store)
    claimed = store.claim("payments", 2, 60.0, now=2e9)
    assert store.ack("payments", [c.id for c in claimed]) == len(claimed)
    assert_exact(store)
    # key rotation rewrites payloads only
    for entry_id, data in store.payloads("", 5)[1]:
        assert store.rewrite(entry_id, data, data + b" ")
    assert_exact(store)
    # a purge by reason, then by breaker and status
    assert store.purge(Filter(reason="park_on")) > 0
    assert_exact(store)
    assert store.purge(Filter("mail", "parked")) > 0
    assert_exact(store)
    # dead entries expire
    time.sleep(0.3)
    assert store.expire_dead() > 0
    assert store.count(Filter(status="dead")) == 0
    assert_exact(store)
    assert store.purge() > 0
    assert_exact(store)
    assert store.client.hlen(store.keys.reasons) == 3  # only the marks are left


def test_a_store_without_counters_backfills_them_on_its_first_count_by_reason(
    store: RedisBackoutStore,
) -> None:
    for n in range(25):
        store.park(an_entry(n))
    store.mark_dead(an_entry(3).id, "max_replays")
    forget_counters(store)
    assert store.reason_counters() is None
    assert store.count(Filter(reason="retries_exhausted")) == truth(
        store, Filter(reason="retries_exhausted")
    )
    assert store.client.hget(store.keys.reasons, "~counted") == b"all"
    assert_exact(store)


def test_counts_by_reason_fall_back_to_reading_every_entry_when_they_cannot_backfill(
    store: RedisBackoutStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(12):
        store.park(an_entry(n))
    forget_counters(store)

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise redis.ResponseError("NOPERM this user has no permissions to run 'hset'")

    monkeypatch.setattr(store.reasons, "_backfill", refused)
    for where in filters():
        assert store.count(where) == truth(store, where)
    assert store.reason_counters() is None
    # a filtered listing walks the index without a total, and still finds every match
    assert len(store.list(Filter(reason="park_on"))) == truth(store, Filter(reason="park_on"))


@pytest.mark.parametrize("seed", range(4))
def test_a_backfill_in_batches_among_parks_deletes_and_deaths_counts_each_entry_once(
    store: RedisBackoutStore, seed: int
) -> None:
    rng = random.Random(seed)
    live = [an_entry(n) for n in range(60)]
    for e in live:
        store.park(e)
    forget_counters(store)
    k = store.keys
    keys = [k.index, k.meta, k.reasons, k.stats]
    new = itertools.count(1000)
    flag, done = "reset", 0
    while not done:
        _, done = store.reasons._backfill(keys, [4, flag])
        flag = ""
        # between two batches: entries on both sides of the backfill's progress change
        for _ in range(3):
            op = rng.random()
            if op < 0.4:
                n = next(new)  # parked_at before, inside or after what the backfill counted
                e = an_entry(n, parked_at=T0 + rng.uniform(-5, 70))
                store.park(e)
                live.append(e)
            elif op < 0.7 and live:
                store.delete(live.pop(rng.randrange(len(live))).id)
            elif live:
                store.mark_dead(rng.choice(live).id, "max_replays")
    assert_exact(store)


@pytest.mark.parametrize("size", [3, 7, 8, 20])
def test_a_backfill_counts_entries_that_share_a_parked_at_once(
    store: RedisBackoutStore, size: int
) -> None:
    # given runs of entries with one parked_at, longer and shorter than a batch
    for n in range(40):
        store.park(an_entry(n, parked_at=T0 + n // size))
    forget_counters(store)
    assert store.backfill_reason_counts(batch=7) == 40
    assert_exact(store)


def test_counters_changed_beside_them_by_an_older_release_are_not_trusted(
    store: RedisBackoutStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = [an_entry(n, breaker="payments", reason="breaker_open") for n in range(10)]
    for e in entries:
        store.park(e)
    assert_exact(store)
    # given a worker of an older release that parks for one reason and acks another (the
    # per-breaker counts still agree)
    older_release_park(store, an_entry(100, breaker="payments", reason="retries_exhausted"))
    older_release_delete(store, entries[0])
    # then the counters are not trusted, and a count by reason is still exact (counted again)
    assert store.reason_counters() is None
    assert store.count(Filter(reason="breaker_open")) == 9
    assert_exact(store)
    # when it goes on, then this store object reads every entry rather than backfill again
    older_release_delete(store, entries[1])
    assert store.reason_counters() is None
    batches: list[Any] = []
    backfill = store.reasons._backfill
    monkeypatch.setattr(store.reasons, "_backfill", lambda *a: batches.append(a) or backfill(*a))  # type: ignore[func-returns-value]  # a spy
    assert store.count(Filter(reason="breaker_open")) == 8
    assert batches == []


def test_a_lone_older_release_park_or_delete_is_seen(store: RedisBackoutStore) -> None:
    for n in range(4):
        store.park(an_entry(n))
    late = an_entry(50)
    older_release_park(store, late)
    assert store.reason_counters() is None
    assert store.count(Filter(reason="park_on")) == truth(store, Filter(reason="park_on"))
    assert_exact(store)  # counted again
    older_release_delete(store, late)
    assert store.reason_counters() is None


def test_a_listing_by_reason_that_matches_nothing_reads_no_entry(
    store: RedisBackoutStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(20):
        store.park(an_entry(n, reason="breaker_open"))
    read: list[int] = []
    newest = store.reads.newest
    monkeypatch.setattr(store.reads, "newest", lambda s, c: read.append(c) or newest(s, c))  # type: ignore[func-returns-value]  # a spy
    assert store.list(Filter(reason="redelivered")) == []
    assert read == []


def test_counts_by_reason_stay_exact_under_concurrent_writers_and_a_backfill(
    redis_client: redis.Redis, key_prefix: str, redis_url: str
) -> None:
    seed = RedisBackoutStore(redis_client, key_prefix)
    first = [an_entry(n) for n in range(300)]
    for e in first:
        seed.park(e)
    forget_counters(seed)
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        client = redis.Redis.from_url(redis_url)
        own = RedisBackoutStore(client, key_prefix)
        rng = random.Random(w)
        try:
            for i in range(150):
                n = 10_000 * (w + 1) + i
                own.park(an_entry(n, parked_at=T0 + rng.uniform(0, 400)))
                victim = rng.choice(first).id
                if rng.random() < 0.5:
                    own.delete(victim)
                else:
                    own.mark_dead(victim, "max_replays")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            client.close()

    def backfiller() -> None:
        client = redis.Redis.from_url(redis_url)
        try:
            RedisBackoutStore(client, key_prefix).backfill_reason_counts(batch=5)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    threads.append(threading.Thread(target=backfiller))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert_exact(seed)
