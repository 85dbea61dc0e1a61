"""The store is no back door: signed entries, sealed arguments, key rotation (every backend).

Each test runs against the memory store, real Redis, and the database store on SQLite and on
PostgreSQL (the contract suite's ``make_store``). Entries are altered or forged by writing bytes
straight into the store, as someone with write access to it would.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis
from cryptography.fernet import Fernet

from celery_resilience.adopt import adopt, candidates
from celery_resilience.backout import Codec, ParkedTask, RedisBackoutStore
from celery_resilience.backout.entry import UNVERIFIED_TASK
from celery_resilience.backout.lifetime import Consumed, replayed_copy
from celery_resilience.backout.trust import Untrusted
from celery_resilience.rekey import rekey
from tests.support.raw_entries import put_raw
from tests.support.stores import MakeStore, entry, raw

pytestmark = pytest.mark.contract

KEY = "k1-" + "s" * 30
OTHER_KEY = "k2-" + "t" * 30
FERNET = Fernet.generate_key().decode()
FERNET_2 = Fernet.generate_key().decode()
#: Text that appears only in the task's arguments, options and error. No 3 bytes of it repeat
#: or occur elsewhere in an entry: the LZF compression of ``DUMP`` leaves its first copy whole.
SECRET = "QZJX-VKWY-PQXJ-ZKVW"


def secret_entry(n: int = 1) -> ParkedTask:
    return entry(
        n,
        args=[SECRET, n],
        kwargs={"token": SECRET},
        options={"queue": "payments", "argsrepr": f"('{SECRET}',)", "headers": {}},
        exc_message=f"gateway refused {SECRET}",
        traceback=f"Traceback...\nConnectionError: {SECRET}",
    )


def put(store: Any, e: ParkedTask, data: bytes | None) -> None:
    """Write ``data`` as the bytes of ``e`` (its meta as a park would have written it)."""
    assert data is not None
    put_raw(store, e.id, data, breaker=e.breaker, reason=e.reason, parked_at=e.parked_at)


def signed(serializer: str = "json", *keys: str) -> Codec:
    return Codec(serializer, signing_keys=keys or (KEY,))


@pytest.mark.parametrize("serializer", ["json", "msgpack"])
def test_signed_entries_round_trip(make_store: MakeStore, serializer: str) -> None:
    store = make_store(codec=signed(serializer))
    e = entry(1)
    store.park(e)
    assert store.get(e.id) == e
    assert raw(store, e.id).startswith(f"2;{serializer};".encode())  # type: ignore[union-attr]


def test_an_altered_payload_reads_as_a_tampered_placeholder_with_its_stored_status(
    make_store: MakeStore,
) -> None:
    store = make_store(codec=signed())
    e = entry(1, kwargs={"order": "A-1"})
    store.park(e)
    altered = raw(store, e.id).replace(b'"A-1"', b'"A-9"')  # type: ignore[union-attr]
    put_raw(store, e.id, altered)
    got = store.get(e.id)
    assert got is not None
    assert (got.task_name, got.status, got.dead_reason) == (UNVERIFIED_TASK, "parked", "tampered")
    assert (got.args, got.kwargs, got.options) == ([], {}, {})
    assert "A-9" not in got.exc_message


def test_entries_forged_without_the_key_are_unsigned_tampered_or_held(
    make_store: MakeStore,
) -> None:
    """A forger without the key signs with a key of its own: its body names that key, so the
    entry is held (never published, never killed) unless it names one this process holds."""
    store = make_store(codec=signed())
    store.park(entry(0))
    unsigned, foreign, posing = entry(1), entry(2), entry(3)
    put(store, unsigned, Codec("json").encode(unsigned))
    put(store, foreign, signed("json", OTHER_KEY).encode(foreign))
    forger = signed("json", OTHER_KEY)
    ours, theirs = (c.signer.key_id.encode() for c in (store.codec, forger))  # type: ignore[union-attr]
    put(store, posing, forger.encode(posing).replace(theirs, ours))  # names a key held here
    assert store.get(unsigned.id).dead_reason == "unsigned"  # type: ignore[union-attr]
    held = store.get(foreign.id)
    assert held is not None
    assert (held.status, held.dead_reason, held.args) == ("parked", None, [])
    assert "which this process lacks" in (held.held or "")
    assert store.get(posing.id).dead_reason == "tampered"  # type: ignore[union-attr]
    # What a drain would get: placeholders, never the forged task.
    claimed = {c.id: c for c in store.claim("payments", 10, 30.0, now=2e9)}
    assert claimed[unsigned.id].task_name == UNVERIFIED_TASK
    assert claimed[posing.id].dead_reason == "tampered"
    assert claimed[foreign.id].held is not None


def test_a_signed_payload_copied_under_another_id_is_tampered(make_store: MakeStore) -> None:
    store = make_store(codec=signed())
    e = entry(1)
    store.park(e)
    put_raw(store, "copy-1", raw(store, e.id), breaker="payments")  # type: ignore[arg-type]
    assert store.get("copy-1").dead_reason == "tampered"  # type: ignore[union-attr]


def test_every_configured_key_verifies_and_rotation_re_signs(make_store: MakeStore) -> None:
    old = make_store(codec=signed("json", KEY))
    e = entry(1)
    old.park(e)
    both = make_store(codec=signed("json", OTHER_KEY, KEY))
    put(both, e, raw(old, e.id))
    assert both.get(e.id) == e  # the old key still verifies
    report = rekey(both, both.codec, now=time.time(), batch=1)
    assert (report.rewritten, report.refused) == (1, {})
    new_only = make_store(codec=signed("json", OTHER_KEY))
    put(new_only, e, raw(both, e.id))
    assert new_only.get(e.id) == e


def test_rotation_leaves_forged_entries_and_adopts_unsigned_only_when_asked(
    make_store: MakeStore,
) -> None:
    store = make_store(codec=signed())
    legacy, forged = entry(1), entry(2)
    put(store, legacy, Codec("json").encode(legacy))
    put(store, forged, signed("json", OTHER_KEY).encode(forged))
    report = rekey(store, store.codec, now=time.time())
    assert (report.rewritten, report.refused) == (0, {"unsigned": 1, "unknown_key": 1})
    chosen = list(candidates(store, before=legacy.parked_at + 1))
    assert [c.entry.id for c in chosen] == [legacy.id]
    assert adopt(store, store.codec, chosen).signed == 1
    report = rekey(store, store.codec, now=time.time())
    assert (report.rewritten, report.refused) == (1, {"unknown_key": 1})
    assert store.get(legacy.id).task_id == legacy.task_id  # type: ignore[union-attr]
    assert store.get(forged.id).held is not None  # type: ignore[union-attr]


def test_sealed_entries_read_whole_with_the_key_and_encrypted_without(
    make_store: MakeStore,
) -> None:
    sealing = make_store(codec=Codec("json", (KEY,), (FERNET,)))
    e = secret_entry()
    sealing.park(e)
    stored = raw(sealing, e.id)
    assert stored is not None
    assert SECRET.encode() not in stored
    assert sealing.get(e.id) == e
    blind = make_store(codec=signed())  # verifies the signature, has no encryption key
    put(blind, e, stored)
    got = blind.get(e.id)
    assert got is not None
    assert got.encrypted
    assert (got.task_name, got.task_id, got.status) == (e.task_name, e.task_id, "parked")
    assert (got.args, got.kwargs, got.options, got.exc_message) == ([], {}, {}, "")


def test_rotation_re_encrypts_with_the_first_key(make_store: MakeStore) -> None:
    store = make_store(codec=Codec("json", (), (FERNET_2, FERNET)))
    e = secret_entry()
    put(store, e, Codec("json", (), (FERNET,)).encode(e))
    assert store.get(e.id) == e
    assert rekey(store, store.codec, now=time.time()).rewritten == 1
    only_new = Codec("json", (), (FERNET_2,))
    assert only_new.decode(raw(store, e.id), e.id) == e  # type: ignore[arg-type]
    with pytest.raises(Untrusted, match="no configured encryption key"):
        Codec("json", (), (FERNET,)).decode(raw(store, e.id), e.id)  # type: ignore[arg-type]


# -- Redis specifics: what the scripts keep beside the payload ------------------------------


def test_meta_changed_beside_a_signed_payload_is_tampered(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    store = RedisBackoutStore(redis_client, key_prefix, codec=signed())
    held, moved = entry(1, reason="redelivered"), entry(2)
    store.park(held)
    store.park(moved)
    # A held entry made due by rewriting its reason; another moved under a breaker of its own.
    redis_client.hset(store.keys.meta, held.id, "parked|breaker_open||payments")
    redis_client.hset(store.keys.meta, moved.id, "parked|breaker_open||other")
    assert store.get(held.id).dead_reason == "tampered"  # type: ignore[union-attr]
    assert store.get(moved.id).dead_reason == "tampered"  # type: ignore[union-attr]


def test_no_argument_is_stored_in_clear_with_encryption_on(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """``DUMP`` of every key the store made: the secret is in none of them when sealed, and is
    found by the same search when not (the search itself works)."""

    def dumped(prefix: str, codec: Codec) -> bytes:
        store = RedisBackoutStore(redis_client, prefix, codec=codec)
        for n in range(3):
            store.park(secret_entry(n))
        store.mark_dead(store.list(limit=1)[0].id, "max_replays")
        store.claim("payments", 1, 30.0, now=2e9)
        keys = list(redis_client.scan_iter(match=f"*{prefix}*"))
        assert len(keys) >= 6
        return b"".join(redis_client.dump(k) or b"" for k in keys)

    assert SECRET.encode() in dumped(f"{key_prefix}-clear", Codec("json"))
    assert SECRET.encode() not in dumped(f"{key_prefix}-sealed", Codec("json", (KEY,), (FERNET,)))


def test_a_sealed_token_moved_to_another_entry_does_not_open(make_store: MakeStore) -> None:
    """Even without signing: the token is bound to its entry id."""
    store = make_store(codec=Codec("json", (), (FERNET,)))
    first, second = secret_entry(1), secret_entry(2)
    store.park(first)
    store.park(second)
    token = json.loads(raw(store, first.id).partition(b"\n")[2])["sealed"]  # type: ignore[union-attr]
    header, _, body = raw(store, second.id).partition(b"\n")  # type: ignore[union-attr]
    put(store, second, header + b"\n" + json.dumps({**json.loads(body), "sealed": token}).encode())
    got = store.get(second.id)
    assert got is not None
    assert (got.status, got.dead_reason) == ("parked", "undecryptable")


def test_every_store_remembers_what_was_published_and_tells_a_copy_from_a_new_park(
    make_store: MakeStore,
) -> None:
    store = make_store(codec=signed())
    e = entry(1)
    store.park(e)
    copied = raw(store, e.id)
    assert copied is not None
    store.ack("payments", [e.id], [Consumed(e.id, e.parked_at, until=4e9)])
    assert store.get(e.id) is None
    put(store, e, copied)  # written back, as it was
    back = store.get(e.id)
    assert back is not None
    consumed = store.consumed([e.id, "nothing-of-that-id"])
    assert consumed == {e.id: e.parked_at}
    assert replayed_copy(back, consumed)
    assert not replayed_copy(e.replace(parked_at=e.parked_at + 1), consumed)  # parked again
    older = Consumed(e.id, e.parked_at - 10, until=3.0)  # an older copy, sent by hand
    store.ack("payments", [e.id], [older])
    assert store.consumed([e.id]) == {e.id: e.parked_at}  # the latest is what is kept


def test_an_ack_of_no_entry_still_remembers_and_forgets_what_is_past(
    make_store: MakeStore,
) -> None:
    store = make_store(codec=signed())
    store.ack("payments", [], [Consumed("other", 5.0, until=4e9)])
    assert store.consumed(["other"]) == {"other": 5.0}
    store.ack("payments", [], [Consumed("short", 1.0, until=2.0)])  # its time is up already
    assert store.consumed(["short", "other"]) == {"other": 5.0}
    assert store.forget_consumed() == 0
