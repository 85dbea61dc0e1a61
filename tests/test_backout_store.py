"""The back-out store contract: one suite, run against every backend."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import redis
import redis.backoff
import redis.retry

from celery_resilience.backout import (
    NO_BREAKER,
    Filter,
    ParkedTask,
    RedisBackoutStore,
    StoreFull,
    encode,
)
from celery_resilience.backout.entry import UNDECODABLE_TASK
from celery_resilience.backout.masking import SHOW_ALL
from celery_resilience.delivery import parking
from celery_resilience.errors import ConfigurationError, StoreUnavailable
from tests.support.raw_entries import put_raw
from tests.support.stores import T0, MakeStore, Store, entry, raw
from tests.support.waiting import wait_for

pytestmark = pytest.mark.contract


@pytest.fixture
def store(make_store: MakeStore) -> Store:
    return make_store()


def ids(entries: list[ParkedTask]) -> list[str]:
    return [e.id for e in entries]


# -- park and get ---------------------------------------------------------------------------


def test_park_get_round_trip_of_every_field(store: Store) -> None:
    named = entry(1, retries=5, replays=2, exc_message="ü" * 50)
    anonymous = entry(2, breaker=None, reason="retries_exhausted", kwargs={}, options={})
    store.park(named)
    store.park(anonymous)
    assert store.get(named.id) == named
    assert store.get(anonymous.id) == anonymous
    assert store.get(anonymous.id).breaker is None  # type: ignore[union-attr]
    assert store.get(uuid.uuid4().hex) is None


def test_park_is_idempotent_for_the_same_id(store: Store) -> None:
    first = entry(1)
    store.park(first)
    store.park(first)
    store.park(first.replace(task_name="other", breaker="else"))
    assert store.count() == 1
    assert store.get(first.id) == first
    assert store.breakers() == {"payments"}


def delivery(task_id: str, *args: Any, retries: int = 0, **kwargs: Any) -> SimpleNamespace:
    """What parking reads of a task's request (one delivery of a message)."""
    return SimpleNamespace(id=task_id, args=list(args), kwargs=kwargs, retries=retries, headers={})


def test_a_reused_task_id_with_other_arguments_parks_beside_the_entry_not_into_it(
    store: Store,
) -> None:
    # Given an entry parked for task id "order-1" with amount 10
    def park(request: SimpleNamespace) -> ParkedTask:
        made = parking.new_entry(
            "shop.charge", request, {}, "payments", "breaker_open", None, T0, 30.0
        )
        parking.store(store, made, SHOW_ALL)
        return made

    first = park(delivery("order-1", 10, currency="EUR", note="gift"))
    # When the same message comes again (a redelivery after a crash), a copy of it is published
    # with its kwargs in another order, and another message reuses the task id with another amount
    again = park(delivery("order-1", 10, currency="EUR", note="gift"))
    copy = park(delivery("order-1", 10, note="gift", currency="EUR"))
    other = park(delivery("order-1", 99, currency="EUR", note="gift"))
    # Then the same body parked onto the first entry, and the other body has an entry of its own
    assert again.id == copy.id == first.id
    assert other.id != first.id
    assert store.count() == 2
    kept = {e.id: (e.task_id, e.args, e.kwargs["currency"]) for e in store.list()}
    assert kept == {first.id: ("order-1", [10], "EUR"), other.id: ("order-1", [99], "EUR")}


def test_a_dead_entry_can_be_parked_directly(store: Store) -> None:
    dead = entry(1, status="dead", dead_reason="unregistered")
    store.park(dead)
    assert store.get(dead.id) == dead
    assert store.count(Filter(status="dead")) == 1
    assert store.count(Filter(status="parked")) == 0


# -- count, list, breakers ------------------------------------------------------------------


@pytest.fixture
def mixed(store: Store) -> list[ParkedTask]:
    """Six entries: three breakers, both statuses, several reasons; parked_at T0+0..T0+5."""
    entries = [
        entry(0, breaker="payments", reason="breaker_open"),
        entry(1, breaker="payments", reason="retries_exhausted"),
        entry(2, breaker="mail", reason="breaker_open"),
        entry(3, breaker=None, reason="delay_too_long"),
        entry(4, breaker="payments", reason="park_on"),
        entry(5, breaker=None, reason="retries_exhausted"),
    ]
    for e in entries:
        store.park(e)
    assert store.mark_dead(entries[1].id, "max_replays")
    assert store.mark_dead(entries[5].id, "unregistered")
    return entries


def test_count_with_every_filter(store: Store, mixed: list[ParkedTask]) -> None:
    assert store.count() == 6
    assert store.count(Filter(breaker="payments")) == 3
    assert store.count(Filter(breaker="mail")) == 1
    assert store.count(Filter(breaker=NO_BREAKER)) == 2
    assert store.count(Filter(breaker="nobody")) == 0
    assert store.count(Filter(status="parked")) == 4
    assert store.count(Filter(status="dead")) == 2
    assert store.count(Filter(breaker="payments", status="dead")) == 1
    assert store.count(Filter(breaker=NO_BREAKER, status="parked")) == 1
    assert store.breakers() == {"payments", "mail", NO_BREAKER}


def test_count_by_reason_counts_only_that_reason(store: Store, mixed: list[ParkedTask]) -> None:
    assert store.count(Filter(reason="retries_exhausted")) == 2  # one named breaker, one none
    assert store.count(Filter(reason="breaker_open")) == 2
    assert store.count(Filter(reason="redelivered")) == 0
    assert store.count(Filter(breaker="payments", reason="retries_exhausted")) == 1
    assert store.count(Filter(status="parked", reason="retries_exhausted")) == 0
    assert store.count(Filter(NO_BREAKER, "parked", "delay_too_long")) == 1


def test_list_newest_first_with_every_filter(store: Store, mixed: list[ParkedTask]) -> None:
    e = mixed
    assert ids(store.list()) == ids(e[::-1])
    assert ids(store.list(Filter(breaker="payments"))) == [e[4].id, e[1].id, e[0].id]
    assert ids(store.list(Filter(breaker=NO_BREAKER))) == [e[5].id, e[3].id]
    assert ids(store.list(Filter(status="dead"))) == [e[5].id, e[1].id]
    assert ids(store.list(Filter(status="parked"))) == [e[4].id, e[3].id, e[2].id, e[0].id]
    assert ids(store.list(Filter(reason="breaker_open"))) == [e[2].id, e[0].id]
    assert ids(store.list(Filter(breaker="payments", status="parked", reason="park_on"))) == [
        e[4].id
    ]
    assert store.list(Filter(breaker="mail", status="dead")) == []
    dead = store.list(Filter(status="dead"))
    assert [(d.status, d.dead_reason) for d in dead] == [
        ("dead", "unregistered"),
        ("dead", "max_replays"),
    ]
    assert dead[1] == e[1].replace(status="dead", dead_reason="max_replays")


def test_list_pages(store: Store, mixed: list[ParkedTask]) -> None:
    newest_first = ids(mixed[::-1])
    assert ids(store.list(limit=2)) == newest_first[:2]
    assert ids(store.list(limit=2, offset=2)) == newest_first[2:4]
    assert ids(store.list(limit=10, offset=4)) == newest_first[4:]
    assert store.list(offset=6) == []
    assert store.list(limit=0) == []
    payments = [mixed[4].id, mixed[1].id, mixed[0].id]
    assert ids(store.list(Filter(breaker="payments"), limit=1, offset=1)) == payments[1:2]
    assert ids(store.list(Filter(breaker="payments"), limit=5, offset=2)) == payments[2:]


def test_list_pages_through_many_entries(store: Store) -> None:
    for n in range(1200):  # more than one internal page of the Redis store
        store.park(entry(n, breaker="a" if n % 3 else "b"))
    b_newest = [f"task-{n}" for n in range(1199, -1, -1) if n % 3 == 0]
    listed = store.list(Filter(breaker="b"), limit=50, offset=300)
    assert [x.task_id for x in listed] == b_newest[300:350]
    assert [x.task_id for x in store.list(limit=3, offset=1100)] == [
        "task-99",
        "task-98",
        "task-97",
    ]


def test_a_filter_that_can_never_match_is_refused_when_made() -> None:
    # A typo fails where it is written, before any store sees it: never an empty answer.
    with pytest.raises(ValueError, match="status must be one of"):
        Filter(status="PARKED")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reason must be one of"):
        Filter(breaker="payments", reason="bored")  # type: ignore[arg-type]
    assert Filter(NO_BREAKER, "dead", "redelivered").status == "dead"


def test_bad_pages_and_dead_reasons_are_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="offset"):
        store.list(offset=-1)
    with pytest.raises(ValueError, match="dead_reason"):
        store.mark_dead("x", "a|b")


# -- delete and purge -----------------------------------------------------------------------


def test_delete(store: Store, mixed: list[ParkedTask]) -> None:
    assert store.delete(mixed[2].id) is True
    assert store.delete(mixed[2].id) is False
    assert store.delete("never-there") is False
    assert store.get(mixed[2].id) is None
    assert store.count() == 5
    assert "mail" not in store.breakers()
    assert store.delete(mixed[1].id) is True  # a dead one
    assert store.count(Filter(status="dead")) == 1


@pytest.mark.parametrize(
    ("filters", "removed"),
    [
        ({"breaker": "payments"}, {0, 1, 4}),
        ({"breaker": NO_BREAKER}, {3, 5}),
        ({"status": "dead"}, {1, 5}),
        ({"reason": "retries_exhausted"}, {1, 5}),
        ({"breaker": "payments", "status": "parked"}, {0, 4}),
        ({"breaker": "mail", "status": "dead"}, set()),
        ({}, {0, 1, 2, 3, 4, 5}),
    ],
)
def test_purge_by_filter(
    store: Store, mixed: list[ParkedTask], filters: dict[str, Any], removed: set[int]
) -> None:
    assert store.purge(Filter(**filters)) == len(removed)
    assert set(ids(store.list())) == {e.id for n, e in enumerate(mixed) if n not in removed}
    assert store.count() == 6 - len(removed)
    assert store.count(Filter(status="dead")) == len({1, 5} - removed)


def test_the_tally_is_every_breakers_count_in_one_read(
    store: Store, mixed: list[ParkedTask]
) -> None:
    tally = store.tally()
    for breaker in store.breakers():
        for status in ("parked", "dead"):
            assert tally.get((breaker, status), 0) == store.count(Filter(breaker, status))
    assert sum(tally.values()) == store.count() == 6


def test_counters_of_breakers_named_at_call_time_are_kept_per_family(store: Store) -> None:
    """A thousand hosts must not make a thousand counters: they count under ``<base>:*``."""
    store.family_of = lambda name: "hook" if name.startswith("hook:") else None
    for n in range(5):
        store.park(entry(n, breaker=f"hook:h{n}.example"))
    store.park(entry(9))
    stats = store.stats()
    assert stats["parked|hook:*|breaker_open"] == 5
    assert stats["parked|payments|breaker_open"] == 1
    assert not [key for key in stats if "example" in key]
    assert store.count(Filter("hook:h3.example")) == 1  # the entries keep their own breaker


def test_purge_many_goes_in_batches_and_reports_each(store: Store) -> None:
    for n in range(1100):
        store.park(entry(n, breaker=f"b{n % 4}", status="dead" if n % 10 == 0 else "parked"))
    steps: list[int] = []
    assert store.purge(Filter(breaker="b1"), steps.append) == 275
    assert sum(steps) == 275
    assert store.count() == 825
    steps.clear()
    assert store.purge(progress=steps.append) == 825
    assert sum(steps) == 825
    if isinstance(store, RedisBackoutStore):  # one delete.lua of at most 500 each
        assert len(steps) >= 2
        assert max(steps) <= 500
    assert store.count() == 0
    assert store.breakers() == set()


# -- capacity -------------------------------------------------------------------------------


def test_store_full_refuses_loudly_and_drops_nothing(make_store: MakeStore) -> None:
    store = make_store(max_entries=3)
    kept = [entry(n) for n in range(3)]
    for e in kept:
        store.park(e)
    store.mark_dead(kept[0].id, "max_replays")  # dead entries count too
    extra = entry(9)
    with pytest.raises(StoreFull) as info:
        store.park(extra)
    assert info.value.max_entries == 3
    assert info.value.entry_id == extra.id
    assert store.count() == 3
    assert store.get(extra.id) is None
    assert all(store.get(e.id) is not None for e in kept)
    store.park(kept[1])  # re-parking a stored id is still a no-op, not an error
    assert store.delete(kept[2].id)
    store.park(extra)
    assert store.get(extra.id) == extra


def test_concurrent_parks_never_exceed_max_entries(make_store: MakeStore) -> None:
    store = make_store(max_entries=40)
    full = []

    def park_many(worker: int) -> None:
        for n in range(20):
            try:
                store.park(entry(worker * 100 + n))
            except StoreFull:
                full.append(1)

    threads = [threading.Thread(target=park_many, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.count() == 40
    assert len(full) == 40


# -- dead entries ---------------------------------------------------------------------------


def test_a_redelivered_entry_is_never_due_but_can_be_read_and_removed(store: Store) -> None:
    # A message that crashed its worker max_deliveries times: only a person may send it again.
    poison = entry(1, reason="redelivered", due_at=T0)
    normal = entry(2, due_at=T0)
    for e in (poison, normal):
        store.park(e)
    later = T0 + 10**6
    assert store.due("payments", now=later) == 1
    claimed = store.claim("payments", 10, lease=60.0, now=later)
    assert [e.id for e in claimed] == [normal.id]
    assert store.claim("payments", 10, lease=60.0, now=later + 30) == []  # leased, held
    assert store.get(poison.id) == poison
    assert store.count(Filter(status="parked")) == 2
    assert store.delete(poison.id)


def test_mark_dead(store: Store) -> None:
    e = entry(1)
    store.park(e)
    assert store.mark_dead(e.id, "max_replays") is True
    got = store.get(e.id)
    assert got == e.replace(status="dead", dead_reason="max_replays")
    assert store.mark_dead(e.id, "again") is False
    assert store.get(e.id).dead_reason == "max_replays"  # type: ignore[union-attr]
    assert store.mark_dead("never-there", "max_replays") is False
    assert (store.count(Filter(status="parked")), store.count(Filter(status="dead"))) == (0, 1)
    if isinstance(store, RedisBackoutStore):
        keys = store.keys
        assert store.client.zscore(keys.ready("payments"), e.id) is None
        assert store.client.zscore(keys.dead, e.id) is not None


def test_claimed_entries_given_back_are_due_again_at_the_time_given(store: Store) -> None:
    """A drain gives back what it claimed and did not replay; ``release``, the earlier name of
    ``give_back``, still does the same (``release`` names a permit's end everywhere else)."""
    first, second = entry(1), entry(2)
    store.park(first)
    store.park(second)
    assert len(store.claim("payments", 10, 30.0, now=T0 + 100)) == 2
    assert store.give_back("payments", [first.id, "never-there"], T0 + 200) == 1
    assert store.release("payments", [second.id], T0 + 200) == 1
    assert store.give_back("payments", [first.id], T0 + 200) == 0  # given back already
    assert (store.due("payments", now=T0 + 199), store.due("payments", now=T0 + 200)) == (0, 2)


def test_held_entries_count_until_a_drain_reads_them_or_they_die_or_go(store: Store) -> None:
    """The drain gives back what it can't read, held for a reason; it counts, by reason, with
    the oldest one's park time, until a drain gives it back read, kills it or it is removed."""
    entries = [entry(n) for n in range(5)]
    for e in entries:
        store.park(e)
    claimed = store.claim("payments", 10, 30.0, now=T0 + 100)
    assert len(claimed) == 5
    assert store.held_entries() == {}
    first, second, third, fourth, fifth = ids(entries)
    assert store.hold("payments", [first, second, third], "unknown_key", T0 + 200) == 3
    assert store.hold("payments", [fourth], "newer_format", T0 + 200) == 1
    assert store.held_entries() == {
        "unknown_key": (3, entries[0].parked_at),
        "newer_format": (1, entries[3].parked_at),
    }
    assert store.due("payments", now=T0 + 120) == 0  # the held due at T0 + 200, one leased
    store.claim("payments", 10, 30.0, now=T0 + 300)
    assert store.give_back("payments", [first], T0 + 400) == 1  # read at last: no longer held
    assert store.mark_dead(second, "tampered")  # judged
    assert store.delete(fourth)
    assert store.ack("payments", [third]) == 1
    assert store.held_entries() == {}
    assert store.hold("payments", [fifth], "unknown_key", T0 + 400) == 1
    assert store.held_entries() == {"unknown_key": (1, entries[4].parked_at)}
    assert store.entries([fifth, "absent", first]) == [entries[4], entries[0]]


def test_dead_entries_are_told_by_their_dead_reason(store: Store) -> None:
    entries = [entry(n) for n in range(4)]
    for e in entries:
        store.park(e)
    store.mark_dead(entries[0].id, "replayed")
    store.mark_dead(entries[1].id, "replayed")
    store.mark_dead(entries[2].id, "unpublishable: the broker said no")
    assert store.dead_by_reason() == {"replayed": 2, "unpublishable": 1}


def test_dead_entries_expire_after_dead_ttl(make_store: MakeStore) -> None:
    # Waits for the expiry instead of sleeping past it; the TTL is wide enough that the
    # "not yet" checks hold on a loaded machine (they would fail only after a 1 s stall).
    store = make_store(dead_ttl=1.0)
    old, young, parked = entry(1), entry(2), entry(3)
    for e in (old, young, parked):
        store.park(e)
    store.mark_dead(old.id, "max_replays")
    assert store.expire_dead() == 0
    wait_for(lambda: store.expire_dead() == 1, "the old dead entry to expire", 10)
    store.mark_dead(young.id, "max_replays")
    assert store.expire_dead() == 0
    assert store.get(old.id) is None
    assert {x.id for x in store.list()} == {young.id, parked.id}
    assert store.count(Filter(status="dead")) == 1


def test_dead_entries_are_kept_without_dead_ttl(store: Store) -> None:
    e = entry(1)
    store.park(e)
    store.mark_dead(e.id, "max_replays")
    assert store.expire_dead() == 0
    assert store.count() == 1


# -- undecodable entries --------------------------------------------------------------------


def test_corrupt_bytes_give_a_placeholder_and_are_kept(store: Store) -> None:
    good, bad = entry(1), entry(2, breaker="mail", reason="park_on")
    store.park(good)
    store.park(bad)
    put_raw(store, bad.id, b"\x00\xffgarbage")
    placeholder = store.get(bad.id)
    assert placeholder is not None
    assert placeholder.task_name == UNDECODABLE_TASK
    # Its status is the store's: parked, until a drain marks it dead for the reason it gives.
    assert (placeholder.status, placeholder.dead_reason) == ("parked", "undecodable")
    assert placeholder.exc_message
    assert bad.id in placeholder.exc_message
    assert (placeholder.breaker, placeholder.reason) == ("mail", "park_on")
    assert placeholder.parked_at == bad.parked_at
    assert (placeholder.args, placeholder.kwargs, placeholder.task_id) == ([], {}, "")
    assert raw(store, bad.id) == b"\x00\xffgarbage"
    assert store.count() == 2
    assert store.count(Filter(breaker="mail")) == 1
    assert ids(store.list()) == [bad.id, good.id]
    assert store.list()[0] == placeholder
    assert raw(store, bad.id) == b"\x00\xffgarbage"
    # It can be quarantined without being decoded, and deleted on purpose.
    assert store.mark_dead(bad.id, "undecodable")
    assert store.count(Filter(status="dead")) == 1
    assert raw(store, bad.id) == b"\x00\xffgarbage"
    assert store.delete(bad.id)
    assert store.count() == 1


def test_raw_bytes_of_an_unknown_id_are_counted(store: Store) -> None:
    put_raw(store, "raw-1", b"1;application/json;utf-8\n{}")
    got = store.get("raw-1")
    assert got is not None
    assert got.task_name == UNDECODABLE_TASK
    assert got.breaker is None
    assert store.count() == 1
    assert store.count(Filter(breaker=NO_BREAKER)) == 1
    assert "missing fields" in got.exc_message


def test_pickle_is_read_only_by_a_store_that_writes_pickle(make_store: MakeStore) -> None:
    e = entry(1, args=[("a", "tuple")])
    strict = make_store()
    strict.park(entry(0))
    put_raw(strict, e.id, encode(e, "pickle"))
    got = strict.get(e.id)
    assert got is not None
    assert got.task_name == UNDECODABLE_TASK
    assert "not one this store reads" in got.exc_message
    assert strict.count() == 2

    pickling = make_store(serializer="pickle")
    pickling.park(e)
    assert raw(pickling, e.id).startswith(b"2;pickle;-\n")  # type: ignore[union-attr]
    assert pickling.get(e.id) == e


def test_a_serializer_outside_the_allow_list_is_a_configuration_error(
    make_store: MakeStore,
) -> None:
    with pytest.raises(ConfigurationError, match="resilience_serializer"):
        make_store(serializer="yaml")


# -- Redis specifics ------------------------------------------------------------------------


@pytest.fixture
def redis_store(redis_client: redis.Redis, key_prefix: str) -> RedisBackoutStore:
    return RedisBackoutStore(redis_client, key_prefix)


def test_every_key_shares_the_hash_tag(redis_store: RedisBackoutStore, key_prefix: str) -> None:
    for n in range(3):
        redis_store.park(entry(n, breaker=[None, "a", "b"][n]))
    redis_store.mark_dead(redis_store.list()[0].id, "max_replays")
    client = redis_store.client
    keys = {k.decode() for k in client.scan_iter(match=f"*{key_prefix}*")}
    tag = f"{{{key_prefix}:backout}}"
    assert all(k.startswith(tag + ":") for k in keys)
    assert {k[len(tag) + 1 :] for k in keys} == {
        "entries",
        "index",
        "meta",
        "counts",
        "dead",
        "ready:-",
        "ready:a",
        "stats",
        "reasons",
    }


def test_in_flight_entries_still_read_as_parked(redis_store: RedisBackoutStore) -> None:
    e = entry(1)
    redis_store.park(e)
    keys, client = redis_store.keys, redis_store.client
    client.zrem(keys.ready("payments"), e.id)  # what the drain's claim will do
    client.zadd(keys.inflight, {e.id: time.time() + 60})
    assert redis_store.get(e.id) == e
    assert redis_store.count(Filter(status="parked")) == 1
    assert ids(redis_store.list(Filter(status="parked"))) == [e.id]
    assert redis_store.mark_dead(e.id, "max_replays")
    assert client.zscore(keys.inflight, e.id) is None
    other = entry(2)
    redis_store.park(other)
    client.zadd(keys.inflight, {other.id: time.time() + 60})
    assert redis_store.delete(other.id)
    assert client.zcard(keys.inflight) == 0


def test_bad_prefix_is_refused(redis_client: redis.Redis) -> None:
    with pytest.raises(ConfigurationError, match="prefix"):
        RedisBackoutStore(redis_client, "a{b}")


@pytest.fixture
def closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    sock.close()
    return port


def test_unreachable_redis_raises_store_unavailable_quickly(closed_port: int) -> None:
    client = redis.Redis(
        host="127.0.0.1",
        port=closed_port,
        socket_connect_timeout=0.2,
        socket_timeout=0.2,
        retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0),
    )
    store = RedisBackoutStore(client, "unreachable")
    calls: list[Callable[[], object]] = [
        lambda: store.park(entry(1)),
        lambda: store.get("x"),
        store.count,
        store.list,
        lambda: store.list(Filter(breaker="a")),
        lambda: store.delete("x"),
        store.purge,
        store.breakers,
        lambda: store.mark_dead("x", "max_replays"),
    ]
    for call in calls:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            call()
        assert time.monotonic() - started < 2.0


@pytest.mark.parametrize(
    "filters",
    [
        {"status": "dead"},
        {"status": "parked"},
        {"breaker": "b1"},
        {"breaker": "b1", "status": "parked"},
        {"breaker": "b2", "status": "dead"},
        {"breaker": NO_BREAKER},
        {"reason": "retries_exhausted"},
        {"breaker": "b3", "reason": "park_on"},
    ],
)
def test_filtered_pages_are_the_same_from_the_small_sets_and_from_the_index(
    redis_store: RedisBackoutStore, monkeypatch: pytest.MonkeyPatch, filters: dict[str, str]
) -> None:
    from celery_resilience.backout.redis import pages as redis_pages

    made = []
    for n in range(120):
        e = entry(
            n,
            breaker=[None, "b1", "b2", "b3"][n % 4],
            reason=["breaker_open", "retries_exhausted", "park_on"][n % 3],
            status="dead" if n % 7 == 0 else "parked",
        )
        redis_store.park(e)
        made.append(e)
    where = Filter(**filters)  # type: ignore[arg-type]
    expected = [
        e.id
        for e in sorted(made, key=lambda e: e.parked_at, reverse=True)
        if where.breaker in (None, e.breaker or NO_BREAKER)
        and where.status in (None, e.status)
        and where.reason in (None, e.reason)
    ]

    def pages() -> list[list[str]]:
        return [ids(redis_store.list(where, 7, offset)) for offset in range(0, 130, 7)]

    from_sets = pages()
    monkeypatch.setattr(redis_pages, "SMALL", 0)  # every filter walks the index
    walked = pages()
    assert from_sets == walked
    assert [i for page in walked for i in page] == expected


def test_a_filter_that_matches_nothing_reads_no_entry(
    redis_store: RedisBackoutStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery_resilience.backout.redis import pages as redis_pages

    monkeypatch.setattr(redis_pages, "SMALL", 0)
    for n in range(1200):
        redis_store.park(entry(n, breaker="payments"))
    read: list[int] = []
    metas = redis_store.reads.metas
    monkeypatch.setattr(
        redis_store.reads,
        "metas",
        lambda found: read.append(len(found)) or metas(found),  # type: ignore[func-returns-value]  # a spy
    )
    assert redis_store.list(Filter(breaker="payments", status="dead")) == []
    assert redis_store.list(Filter(status="parked"), 10, offset=1200) == []
    assert read == []  # the counters said there was nothing to find
    assert len(redis_store.list(Filter(status="parked"), 10, offset=1195)) == 5


def test_oldest_parked_skips_the_dead_and_is_none_when_nothing_waits(
    store: Store, mixed: list[ParkedTask]
) -> None:
    assert store.oldest_parked() == T0  # entry 0
    assert store.mark_dead(mixed[0].id, "max_replays")
    assert store.oldest_parked() == T0 + 2  # 1 is dead too
    store.purge(Filter(status="parked"))
    assert store.oldest_parked() is None


def test_entries_are_found_by_a_prefix_of_their_id_and_by_their_task_id(
    store: Store, mixed: list[ParkedTask]
) -> None:
    # Given a second entry of task-2 (another retry of it), parked later.
    again = entry(2, retries=3, parked_at=T0 + 9)
    store.park(again)
    target = mixed[4]
    assert ids(store.with_prefix(target.id[:12])) == [target.id]
    assert ids(store.with_prefix(target.id)) == [target.id]
    assert set(ids(store.with_prefix(""))) == set()
    every = store.with_prefix(target.id[:1], limit=100)
    assert {e.id for e in every} == {e.id for e in [*mixed, again] if e.id[0] == target.id[0]}
    assert ids(store.with_task_id("task-2")) == [again.id, mixed[2].id]  # newest first
    assert ids(store.with_task_id("task-2", limit=1)) == [again.id]
    assert store.with_task_id("task-9") == []
    assert store.with_task_id("task") == []  # a task id, not a part of one
    assert ids(store.with_task_id("task-5")) == [mixed[5].id]  # dead ones too
