"""Changes to the store's trust that lose nothing: a rolling key rotation, a newer release's
entries, a consumed entry written back, entries another process quarantined (repair), and the
entry id every release derives alike.

Real Redis store and broker (``tests/support/drain_world.py``); entries are written into the
store's keys as another process, or someone with write access, would.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from celery_resilience import ParkedTask, Resilience
from celery_resilience.backout import Codec, Filter
from celery_resilience.headers import body_digest, entry_id
from tests.support.drain_world import TASK, drain_setup, park, sent_ids
from tests.support.raw_entries import put_raw
from tests.support.resilience import AppSetup, MakeResilience
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def app_setup(queue: str) -> AppSetup:
    """The drain's world: apps with the test's own queue and ``TASK``."""
    return drain_setup(queue)


OLD = "rolling-old-key-" + "o" * 20
NEW = "rolling-new-key-" + "n" * 20


def keyed(make: MakeResilience, *keys: str, **settings: Any) -> Resilience:
    return make(signing_key=list(keys), **settings)


def record_minimum(client: redis.Redis, prefix: str, version: str) -> None:
    """What ``celery resilience fleet --minimum`` records (the fleet's switch), as a person
    writing the key by hand would (no time of record)."""
    client.set(f"{{{prefix}:fleet}}:minimum", version)


def entry_of(task_id: str, queue: str, **fields: Any) -> ParkedTask:
    """An entry of ``TASK`` for breaker ``dep``, to be sent to ``queue``."""
    values: dict[str, Any] = {"reason": "breaker_open", "breaker": "dep", "args": [1]}
    values.update(fields)
    return ParkedTask.new(task_name=TASK, task_id=task_id, options={"queue": queue}, **values)


def test_the_entry_id_of_a_delivery_is_the_one_every_release_derives() -> None:
    """A message parked by the previous release and by this one must be one entry: the vector
    was computed by the previous release's code."""
    digest = body_digest(["order-7"], {"amount": 3}, {"link": None})
    assert digest == "9e592e9f8efd81989956b086285ea97d"
    task_id = "6f1c2d3e-0000-4000-8000-000000000007"
    assert entry_id(task_id, 1, 2, digest) == "5184f0e425af558ea4e6cdbdf9ff9578"


def test_a_drainer_without_the_new_signing_key_holds_its_entries_for_one_that_has_it(
    make_resilience: MakeResilience, redis_client: redis.Redis, key_prefix: str, queue: str
) -> None:
    """A rolling rotation: a worker already on [new, old] parks; beat's drain runs on a
    process still on [old]. The entry names its key: held, never ``tampered``."""
    record_minimum(redis_client, key_prefix, "0.4")
    rotated, behind = keyed(make_resilience, NEW, OLD), keyed(make_resilience, OLD)
    (entry,) = park(rotated, 1, queue)
    report = behind.drain()
    assert report.dead == 0
    assert (report.replayed, report.held) == (0, 1)
    assert sent_ids(redis_client, queue) == []
    shown = behind.backout.get(entry.id)
    assert shown is not None
    assert (shown.status, shown.dead_reason) == ("parked", None)
    assert shown.held is not None
    assert "which this process lacks" in shown.held
    keys = rotated.runtime.backout_store.keys  # type: ignore[attr-defined]
    redis_client.zadd(keys.ready("dep"), {entry.id: 0})  # due now rather than after the hold
    assert rotated.drain().replayed == 1  # a process with the key sends it
    assert sent_ids(redis_client, queue) == [entry.task_id]


@pytest.mark.parametrize("serializer", ["json", "msgpack"])
def test_before_the_switch_a_drainer_without_the_new_key_holds_the_entry_its_body_names(
    serializer: str, make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    """A rolling rotation before the fleet's switch: entries are written in the previous
    release's envelope, whose header names no key, but their signed body does."""
    rotated = keyed(make_resilience, NEW, OLD, serializer=serializer)
    behind = keyed(make_resilience, OLD, serializer=serializer)
    (entry,) = park(rotated, 1, queue)
    store = rotated.runtime.backout_store
    assert store.payload(entry.id).startswith(f"2;{serializer};".encode())  # type: ignore[union-attr]
    report = behind.drain()
    assert (report.replayed, report.dead, report.held) == (0, 0, 1)
    shown = behind.backout.get(entry.id)
    assert shown is not None
    assert (shown.status, shown.dead_reason) == ("parked", None)
    assert "its body says, unverified" in (shown.held or "")
    redis_client.zadd(store.keys.ready("dep"), {entry.id: 0})  # type: ignore[attr-defined]
    assert rotated.drain().replayed == 1
    assert sent_ids(redis_client, queue) == [entry.task_id]


def test_before_the_switch_a_pickled_entry_signed_with_a_key_a_drainer_lacks_is_tampered(
    make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    """A pickled body is never read unverified: before the switch, the documented rotation
    order is what keeps it alive; an entry killed anyway comes back with ``repair``."""
    rotated = keyed(make_resilience, NEW, OLD, serializer="pickle")
    behind = keyed(make_resilience, OLD, serializer="pickle")
    (entry,) = park(rotated, 1, queue)
    assert behind.drain().dead == 1
    store = rotated.runtime.backout_store
    assert store.get(entry.id).dead_reason == "tampered"  # type: ignore[union-attr]
    from celery_resilience.repair import repair, repairable

    assert [
        e.id
        for e in repair(
            store, rotated.runtime.codec(), repairable(store), rotated.runtime.now()
        ).revived
    ] == [entry.id]
    assert rotated.drain().replayed == 1


def test_a_forged_key_id_can_only_keep_an_entry_held(
    make_resilience: MakeResilience, redis_client: redis.Redis, key_prefix: str, queue: str
) -> None:
    record_minimum(redis_client, key_prefix, "0.4")
    res = keyed(make_resilience, OLD)
    store = res.runtime.backout_store
    real, unknown, known = park(res, 3, queue)
    data = store.payload(real.id)
    assert data is not None
    assert data.startswith(b"3;json;")
    header, _, body = data.partition(b"\n")
    _, serializer, key, _ = header.decode().split(";")
    forged = body.replace(b"[0]", b"[666]")
    put_raw(store, unknown.id, f"3;{serializer};{'f' * 16};{'0' * 64}\n".encode() + forged)
    put_raw(store, known.id, f"3;{serializer};{key};{'0' * 64}\n".encode() + forged)
    report = res.drain()
    assert (report.replayed, report.held, report.dead) == (1, 1, 1)
    assert sent_ids(redis_client, queue) == [real.task_id]
    assert store.get(unknown.id).status == "parked"  # type: ignore[union-attr]
    assert store.get(known.id).dead_reason == "tampered"  # type: ignore[union-attr]


def test_entries_held_for_a_key_no_process_holds_or_a_newer_status_show_in_metrics_and_check(
    make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    """An entry signed with a key no drainer holds any more, and one whose metadata a newer
    release wrote, stay held: counted by reason, with the oldest one's age, until read."""
    from celery_resilience.checks import run_checks
    from celery_resilience.metrics import ResilienceCollector

    lost = "a-key-nobody-holds-" + "l" * 20
    res = keyed(make_resilience, NEW)
    store = res.runtime.backout_store
    (signed,) = park(keyed(make_resilience, lost), 1, queue, tag="lost")
    (newer,) = park(res, 1, queue, tag="newer")
    keys = store.keys  # type: ignore[attr-defined]
    redis_client.hset(keys.meta, newer.id, "parked|a_newer_reason||dep")
    report = res.drain()
    assert (report.replayed, report.dead, report.held) == (0, 0, 2)
    held = store.held_entries()
    assert held == {"unknown_key": (1, signed.parked_at), "newer_format": (1, newer.parked_at)}
    families = {f.name: f for f in ResilienceCollector(res).collect()}
    counted = {
        s.labels["reason"]: s.value for s in families["celery_resilience_held_entries"].samples
    }
    assert counted == {"unknown_key": 1.0, "newer_format": 1.0}
    ages = families["celery_resilience_oldest_held_age_seconds"].samples
    assert all(s.value > 0 for s in ages)
    (finding,) = [f for f in run_checks(res.runtime) if "held for a process" in f.message]
    assert finding.level == "warning"
    assert "1 newer_format" in finding.message
    assert "1 unknown_key" in finding.message
    # The key given back to a drainer: read, published, no longer held.
    redis_client.zadd(keys.ready("dep"), {signed.id: 0})
    assert keyed(make_resilience, NEW, lost).drain().replayed == 1
    assert store.held_entries() == {"newer_format": (1, newer.parked_at)}
    assert sent_ids(redis_client, queue) == [signed.task_id]


def test_an_entry_of_a_newer_release_is_held_not_killed(
    make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    res = make_resilience()
    store = res.runtime.backout_store
    (entry,) = park(res, 1, queue)
    put_raw(store, entry.id, b"4;json;k;s;whatever comes next\n{}")
    report = res.drain()
    assert (report.replayed, report.dead) == (0, 0)
    assert report.held == 1
    shown = store.get(entry.id)
    assert shown is not None
    assert shown.status == "parked"
    assert shown.held == "envelope version 4 is newer than this release reads"


def test_a_consumed_entry_written_back_is_dead_replayed_and_not_run_again(
    make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    """Someone copies a signed entry, lets it drain, then writes the bytes back (there is no
    dedup marker: the task has none)."""
    res = keyed(make_resilience, OLD)
    store = res.runtime.backout_store
    (entry,) = park(res, 1, queue)
    copied = redis_client.hget(store.keys.entries, entry.id)  # type: ignore[attr-defined]
    assert isinstance(copied, bytes)
    assert res.drain().replayed == 1
    put_raw(store, entry.id, copied, breaker="dep", reason="breaker_open", parked_at=0.0)
    report = res.drain()
    assert (report.replayed, report.dead) == (0, 1)
    assert sent_ids(redis_client, queue) == [entry.task_id]  # once
    shown = store.get(entry.id)
    assert shown is not None
    assert (shown.status, shown.dead_reason) == ("dead", "replayed")
    assert res.drain().replayed == 0  # never a drain's to send again
    assert sent_ids(redis_client, queue) == [entry.task_id]


def test_the_memory_of_consumed_entries_is_freed_whatever_the_batch_size(
    make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    """1,500 remembered entries whose time is up (left by drains of long ago), then one drain
    of a batch of 1,200: it remembers the 1,200 and forgets every one of the 1,500."""
    res = make_resilience(drain_batch=2000)
    keys = res.runtime.backout_store.keys  # type: ignore[attr-defined]
    past = {f"old-{n}": 1_000.0 + n for n in range(1500)}
    redis_client.hset(keys.consumed, mapping=dict.fromkeys(past, 1.0))
    redis_client.zadd(keys.consumed_until, past)
    entries = park(res, 1200, queue)
    assert res.drain().replayed == 1200
    assert redis_client.hlen(keys.consumed) == 1200
    assert redis_client.zcard(keys.consumed_until) == 1200
    kept = res.runtime.backout_store.consumed([e.id for e in entries])
    assert len(kept) == 1200


def test_check_warns_of_copies_marked_replayed_until_the_fleets_minimum_is_recorded(
    make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    """The previous release does not know ``replayed``: a replay of dead entries by hand there
    would send such a copy. ``check`` says so while that release may still run."""
    from celery_resilience.checks import run_checks

    def warned() -> list[str]:
        found = run_checks(res.runtime)
        return [f.message for f in found if "dead replayed" in f.message]

    res = keyed(make_resilience, OLD)
    store = res.runtime.backout_store
    (entry,) = park(res, 1, queue)
    copied = store.payload(entry.id)
    assert copied is not None
    assert res.drain().replayed == 1
    assert warned() == []
    put_raw(store, entry.id, copied, breaker="dep", reason="breaker_open", parked_at=0.0)
    assert res.drain().dead == 1
    (note,) = warned()
    assert "1 dead entries are copies" in note
    assert "replay --all --status dead" in note
    res.runtime.fleet.record_minimum("0.4")
    assert warned() == []


def test_a_message_parked_again_after_its_entry_was_drained_is_no_copy(
    make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    """A redelivered message parks onto the id its first park had: signed later, it is a new
    park and goes its way (at-least-once; ``deduplicate=True`` runs it once)."""
    res = keyed(make_resilience, OLD)
    store = res.runtime.backout_store
    (entry,) = park(res, 1, queue)
    assert res.drain().replayed == 1
    store.park(entry.replace(parked_at=time.time(), due_at=time.time() - 1))
    assert res.drain().replayed == 1
    assert sent_ids(redis_client, queue) == [entry.task_id] * 2


def test_an_entry_past_its_signed_lifetime_is_dead_stale_and_a_person_may_send_it(
    make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    res = keyed(make_resilience, OLD)
    now = time.time()
    entry = entry_of("stale-1", queue, parked_at=now - 60)
    res.runtime.backout_store.park(entry.replace(expires_at=now - 1))
    report = res.drain()
    assert (report.replayed, report.dead) == (0, 1)
    assert res.backout.get(entry.id).dead_reason == "stale"  # type: ignore[union-attr]
    assert res.backout.replay(entry.id).task_id == entry.task_id
    assert sent_ids(redis_client, queue) == [entry.task_id]


def test_an_entry_due_later_than_its_lifetime_is_sent_when_due_not_killed_stale(
    make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    """A retry parked until it is due (``delay_too_long``) waits longer than the lifetime: the
    lifetime starts when it is due, from Redis's times."""
    res = keyed(make_resilience, OLD, entry_lifetime=1.0)
    now = res.runtime.now()
    entry = entry_of("later-1", queue, reason="delay_too_long", parked_at=now, due_at=now + 2.0)
    res.runtime.backout_store.park(entry)
    stored = res.backout.get(entry.id)
    assert stored is not None
    assert stored.expires_at == entry.due_at + 1.0
    wait_for(lambda: res.runtime.now() > entry.due_at, "the entry to be due", 30.0)
    report = res.drain()
    assert (report.replayed, report.dead) == (1, 0)
    assert sent_ids(redis_client, queue) == [entry.task_id]


def test_rotation_signs_a_lifetime_into_entries_written_before_lifetimes_and_renews_others(
    make_resilience: MakeResilience, queue: str
) -> None:
    """Entries of the previous release carry no lifetime: re-signed, they get one from Redis's
    time. A live lifetime is renewed; one that ended is kept (a copy can't be told then)."""
    from celery_resilience.rekey import rekey

    res = keyed(make_resilience, OLD)
    store, codec = res.runtime.backout_store, res.runtime.codec()
    lifetime = res.runtime.config.entry_lifetime
    now = res.runtime.now()
    older, live, ended = (entry_of(f"old-{n}", queue, parked_at=now - 100) for n in range(3))
    put_raw(store, older.id, Codec("json", (OLD,)).encode(older), breaker="dep",
            reason="breaker_open", parked_at=older.parked_at)  # fmt: skip
    assert store.get(older.id).expires_at is None  # type: ignore[union-attr]
    store.park(live.replace(expires_at=now + 50))
    store.park(ended.replace(expires_at=now - 1))
    assert rekey(store, codec, now=res.runtime.now()).rewritten == 3
    after = {e.id: e.expires_at or 0.0 for e in store.entries([older.id, live.id, ended.id])}
    assert after[older.id] >= now + lifetime
    assert after[live.id] >= now + lifetime
    assert after[ended.id] == now - 1


def test_a_repaired_entry_is_signed_again_with_a_fresh_lifetime_unless_its_own_ended(
    make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    """A process that lacked a key killed entries ``tampered``; repair re-signs those that read
    here with a fresh lifetime. One whose lifetime ended meanwhile needs a person's word."""
    from celery_resilience.repair import repair, repairable

    res = keyed(make_resilience, NEW, OLD)
    store, codec = res.runtime.backout_store, res.runtime.codec()
    now = res.runtime.now()
    soon, ended = (entry_of(f"repaired-{n}", queue, parked_at=now - 100) for n in range(2))
    store.park(soon.replace(expires_at=now + 5))
    store.park(ended.replace(expires_at=now - 5))
    for entry in (soon, ended):
        store.mark_dead(entry.id, "tampered")
    report = repair(store, codec, repairable(store), res.runtime.now())
    assert [e.id for e in report.revived] == [soon.id]
    assert "its signed lifetime ended" in report.refused[ended.id]
    renewed = store.get(soon.id)
    assert renewed is not None
    assert renewed.expires_at is not None
    assert renewed.expires_at >= now + res.runtime.config.entry_lifetime
    vouched = repair(store, codec, repairable(store), res.runtime.now(), past_lifetime=True)
    assert [e.id for e in vouched.revived] == [ended.id]
    assert res.drain().replayed == 2
    assert sorted(sent_ids(redis_client, queue)) == [soon.task_id, ended.task_id]


def test_entries_another_process_quarantined_are_revived_or_refused_with_the_real_reason(
    make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    """A process of another release or with other keys marked good entries dead (undecodable,
    tampered); one that reads them here brings them back, a person's replay sends one."""
    res = keyed(make_resilience, NEW, OLD)
    store = res.runtime.backout_store
    unknown, mistrusted, by_hand, garbage = park(res, 4, queue)
    store.mark_dead(unknown.id, "undecodable")
    store.mark_dead(mistrusted.id, "tampered")
    store.mark_dead(by_hand.id, "undecodable")
    put_raw(store, garbage.id, b"\xff not an entry")
    store.mark_dead(garbage.id, "undecodable")
    assert res.backout.replay(by_hand.id).task_id == by_hand.task_id  # it reads here
    from celery_resilience.repair import repair, repairable

    found = repairable(store)
    assert {e.id for e in found} == {unknown.id, mistrusted.id, garbage.id}
    report = repair(store, res.runtime.codec(), found, res.runtime.now())
    assert {e.id for e in report.revived} == {unknown.id, mistrusted.id}
    assert list(report.refused) == [garbage.id]
    assert "can't be decoded" in report.refused[garbage.id]
    assert store.count(Filter(status="parked")) == 2
    assert res.drain().replayed == 2
    assert sorted(sent_ids(redis_client, queue)) == sorted(
        [by_hand.task_id, unknown.task_id, mistrusted.task_id]
    )


def test_the_rolling_rotation_procedure_kills_nothing_at_any_step(
    make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    """docs/operations.rst's procedure, with processes of each step beside those of the step
    before (the fleet's switch off: it holds with the previous release in the fleet too). At
    every step each process parks and each drains what the others parked: nothing dies."""
    steps = [
        [[OLD], [OLD, NEW]],  # 1. the new key added second, process by process
        [[OLD, NEW], [NEW, OLD]],  # 2. then first, process by process
        [[NEW, OLD], [NEW, OLD]],  # 3. rotate-keys (below), everywhere on [new, old]
        [[NEW, OLD], [NEW]],  # 4. the old key dropped, process by process
    ]
    sent: list[str] = []
    for number, processes in enumerate(steps, start=1):
        fleet = [keyed(make_resilience, *keys) for keys in processes]
        if number == 3:
            from celery_resilience.rekey import rekey

            fresh = fleet[0].runtime
            assert rekey(fresh.backout_store, fresh.codec(), now=fresh.now()).done
        for parker in fleet:
            for drainer in fleet:
                (entry,) = park(parker, 1, queue, tag=f"step{number}")
                report = drainer.drain()
                assert report.dead == 0, (number, processes)
                assert report.held == 0, (number, processes)
                sent.append(entry.task_id)
    assert sent_ids(redis_client, queue) == sent


def test_an_entry_parked_by_the_previous_envelope_and_signed_keeps_verifying_after_switch(
    make_resilience: MakeResilience, redis_client: redis.Redis, key_prefix: str, queue: str
) -> None:
    res = keyed(make_resilience, OLD)
    (before,) = park(res, 1, queue, tag="before")
    record_minimum(redis_client, key_prefix, "0.4")
    res.runtime.fleet.minimum(fresh=True)
    (after,) = park(res, 1, queue, tag="after")
    store = res.runtime.backout_store
    assert store.payload(before.id).startswith(b"2;json;")  # type: ignore[union-attr]
    assert store.payload(after.id).startswith(b"3;json;")  # type: ignore[union-attr]
    assert res.drain().replayed == 2
    assert Codec("json", (OLD,)).signer is not None


def test_check_flags_writers_of_an_older_format_still_at_work(
    make_resilience: MakeResilience, redis_client: redis.Redis, key_prefix: str, queue: str
) -> None:
    """A process without the signing key, and one of the previous release after the fleet's
    minimum was recorded, still park: ``check`` says so from the newest entries. Entries
    parked in the previous envelope before the switch are no sign of anything."""
    from celery_resilience.checks import run_checks
    from celery_resilience.fleet import REFRESH

    def notes() -> list[str]:
        return [f.message for f in run_checks(res.runtime) if "newest entries" in f.message]

    res = keyed(make_resilience, OLD)
    store = res.runtime.backout_store
    (signed,) = park(res, 1, queue)
    assert notes() == []
    unsigned = signed.replace(id="u" * 32)
    put_raw(store, unsigned.id, Codec("json").encode(unsigned), parked_at=time.time())
    res.runtime.fleet.record_minimum("0.4")
    assert len(notes()) == 1  # both envelope 2, parked before the switch: only the unsigned
    late = signed.replace(id="l" * 32, parked_at=res.runtime.now() + REFRESH + 1)
    put_raw(store, late.id, Codec("json", (OLD,)).encode(late), parked_at=late.parked_at)
    found = notes()
    assert len(found) == 2, found
    assert found[0].startswith("1 of the 3 newest entries parked in the last day are unsigned")
    assert found[1].startswith("1 of the 3 newest entries parked in the last day were parked in")


def test_a_workers_report_not_written_for_30_days_is_dropped_when_another_starts(
    make_resilience: MakeResilience, redis_client: redis.Redis
) -> None:
    """Every worker's start writes its report under its host name: names come and go (pods),
    and a report no worker wrote again for ``REPORT_KEPT`` seconds is dropped."""
    from celery_resilience.fleet import REPORT_KEPT

    res = make_resilience()
    fleet = res.runtime.fleet
    now = res.runtime.now()
    gone, alive = f"0.4|{now - REPORT_KEPT - 60!r}", f"0.4|{now - 3600!r}"
    redis_client.hset(fleet.seen_key, mapping={"gone@pod-1": gone, "alive@pod-2": alive})
    assert fleet.report("new@pod-3") == 1
    reports = fleet.reports()
    assert set(reports) == {"alive@pod-2", "new@pod-3"}
    assert reports["new@pod-3"].version == "0.4"
    assert reports["new@pod-3"].at >= now
