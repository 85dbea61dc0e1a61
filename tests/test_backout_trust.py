"""The store is no back door: signed entries, sealed arguments, key rotation (every backend).

Each test runs against the memory store, real Redis, and the database store on SQLite and on
PostgreSQL (the contract suite's ``make_store``). Entries are altered or forged by writing bytes
straight into the store, as someone with write access to it would.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from cryptography.fernet import Fernet

from celery_resilience.backout import Codec, ParkedTask, RedisBackoutStore
from celery_resilience.backout.entry import UNVERIFIED_TASK
from celery_resilience.backout.trust import Untrusted
from celery_resilience.rekey import rekey
from tests import test_backout_store as contract
from tests.support.raw_entries import put_raw
from tests.test_backout_store import MakeStore, entry, raw

pytestmark = pytest.mark.contract

#: The contract suite's fixture: the memory, Redis, SQLite and PostgreSQL stores.
make_store = contract.make_store

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


def test_an_altered_payload_reads_as_a_dead_tampered_placeholder(make_store: MakeStore) -> None:
    store = make_store(codec=signed())
    e = entry(1, kwargs={"order": "A-1"})
    store.park(e)
    altered = raw(store, e.id).replace(b'"A-1"', b'"A-9"')  # type: ignore[union-attr]
    put_raw(store, e.id, altered)
    got = store.get(e.id)
    assert got is not None
    assert (got.task_name, got.status, got.dead_reason) == (UNVERIFIED_TASK, "dead", "tampered")
    assert (got.args, got.kwargs, got.options) == ([], {}, {})
    assert "A-9" not in got.exc_message


def test_entries_forged_without_the_key_are_unsigned_or_tampered(make_store: MakeStore) -> None:
    store = make_store(codec=signed())
    store.park(entry(0))
    unsigned, foreign = entry(1), entry(2)
    put(store, unsigned, Codec("json").encode(unsigned))
    put(store, foreign, signed("json", OTHER_KEY).encode(foreign))
    assert store.get(unsigned.id).dead_reason == "unsigned"  # type: ignore[union-attr]
    assert store.get(foreign.id).dead_reason == "tampered"  # type: ignore[union-attr]
    # What a drain would get: placeholders, never the forged task.
    claimed = {c.id: c for c in store.claim("payments", 10, 30.0, now=2e9)}
    assert claimed[unsigned.id].task_name == UNVERIFIED_TASK
    assert claimed[foreign.id].status == "dead"


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
    report = rekey(both, both.codec, batch=1)
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
    report = rekey(store, store.codec)
    assert (report.rewritten, report.refused) == (0, {"unsigned": 1, "tampered": 1})
    report = rekey(store, store.codec, adopt_unsigned=True)
    assert (report.rewritten, report.refused) == (1, {"tampered": 1})
    assert store.get(legacy.id).task_id == legacy.task_id  # type: ignore[union-attr]
    assert store.get(forged.id).dead_reason == "tampered"  # type: ignore[union-attr]


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
    assert rekey(store, store.codec).rewritten == 1
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
    assert (got.status, got.dead_reason) == ("dead", "undecryptable")
