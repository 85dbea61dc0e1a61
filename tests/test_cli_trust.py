"""The CLI with the store's keys: what it shows where a key is missing, what it says of
untrusted entries, and ``rotate-keys`` (real ``celery resilience`` subprocesses)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis
from cryptography.fernet import Fernet

from celery_resilience.backout import Codec
from tests.support.cli import Cli
from tests.support.raw_entries import put_raw

pytestmark = pytest.mark.integration

SIGNING = "cli-signing-key-" + "a" * 20
NEW_SIGNING = "cli-signing-key-" + "b" * 20
FERNET = Fernet.generate_key().decode()
NEW_FERNET = Fernet.generate_key().decode()


def keyed(cli: Cli, signing: list[str], encryption: list[str]) -> Cli:
    """The same world (prefix, queue) with these keys."""
    keys = json.dumps({"signing": signing or None, "encryption": encryption or None})
    return Cli({**cli.env, "CLIAPP_KEYS": keys}, cli.client)


@pytest.fixture
def worlds(cli: Cli) -> Iterator[dict[str, Cli]]:
    made = {
        "keys": keyed(cli, [SIGNING], [FERNET]),
        "no encryption key": keyed(cli, [SIGNING], []),
        "rotated": keyed(cli, [NEW_SIGNING, SIGNING], [NEW_FERNET, FERNET]),
        "new keys only": keyed(cli, [NEW_SIGNING], [NEW_FERNET]),
    }
    yield made
    for world in made.values():
        world.res.runtime.close()


def test_show_says_encrypted_where_the_key_is_missing(worlds: dict[str, Cli]) -> None:
    entry = worlds["keys"].park(1, kwargs={"amount": 7, "card": "tok_visa"})
    with_key, without = (
        worlds["keys"]("show", entry.id, "--json").json(),
        worlds["no encryption key"]("show", entry.id, "--json").json(),
    )
    assert (with_key["args"], with_key["kwargs"]["card"]) == (["order-1"], "tok_visa")
    assert (without["task_name"], without["task_id"]) == (entry.task_name, entry.task_id)
    assert without["encrypted"] is True
    for field in ("args", "kwargs", "options", "exc_message", "traceback"):
        assert without[field] == "encrypted", field
    human = worlds["no encryption key"]("show", entry.id).stdout
    assert 'args: "encrypted"' in human
    assert "tok_visa" not in human


def test_list_and_show_name_an_untrusted_entry_and_never_its_content(
    worlds: dict[str, Cli],
) -> None:
    world = worlds["keys"]
    forged = world.park(1)  # signed, then replaced by bytes made without the key
    put_raw(world.store, forged.id, Codec("json").encode(forged.replace(args=["evil"])))
    listed = world("list", "--json").json()
    assert [(e["status"], e["dead_reason"]) for e in listed] == [("parked", "unsigned")]
    assert "dead (unsigned)" in world("list").stdout
    shown = world("show", forged.id).stdout
    assert "<unverified>" in shown
    assert "evil" not in shown


def test_rotate_keys_re_signs_and_re_encrypts_every_entry(
    worlds: dict[str, Cli], redis_client: redis.Redis
) -> None:
    entries = [worlds["keys"].park(n) for n in range(3)]
    done = worlds["rotated"]("rotate-keys", "--batch", "2", "--json").json()
    assert done == {"rewritten": 3, "gone_meanwhile": 0, "refused": {}, "not_rewritten": []}
    fresh = worlds["new keys only"]
    assert [e.args for e in fresh.store.list()] == [["order-2"], ["order-1"], ["order-0"]]
    assert {e.id for e in fresh.store.list()} == {e.id for e in entries}


def test_rotate_keys_leaves_what_it_cannot_trust_and_says_so(worlds: dict[str, Cli]) -> None:
    world = worlds["keys"]
    legacy = world.park(1)
    put_raw(world.store, legacy.id, Codec("json").encode(legacy))
    refused = world("rotate-keys", "--json", rc=1).json()
    assert refused == {
        "rewritten": 0,
        "gone_meanwhile": 0,
        "refused": {"unsigned": 1},
        "not_rewritten": [],
    }
    world("rotate-keys", "--adopt-unsigned", "--json", rc=1)  # needs --parked-before
    adopt = ("rotate-keys", "--adopt-unsigned", "--parked-before", "2999-01-01", "--yes")
    assert world(*adopt, "--json").json() == {
        "signed": 1,
        "revived": 0,
        "changed": [],
        "refused": [],
    }
    assert world.store.get(legacy.id) == legacy


def test_list_says_held_for_an_entry_signed_with_a_key_this_process_lacks(
    worlds: dict[str, Cli], redis_client: redis.Redis
) -> None:
    world = worlds["new keys only"]
    redis_client.set(f"{{{world.env['CLIAPP_PREFIX']}:fleet}}:minimum", "0.4")
    worlds["keys"].res.runtime.fleet.minimum(fresh=True)
    entry = worlds["keys"].park(1)
    listed = world("list").stdout
    assert "held" in listed
    assert "signed with key" in listed
    shown = world("show", entry.id, "--json").json()
    assert (shown["status"], shown["dead_reason"]) == ("parked", None)
    assert "which this process lacks" in shown["held"]


def test_repair_parks_again_what_reads_here_and_says_why_for_the_rest(
    worlds: dict[str, Cli],
) -> None:
    world = worlds["keys"]
    good, garbage = world.park(1), world.park(2)
    world.store.mark_dead(good.id, "tampered")  # a process with other keys judged it
    put_raw(world.store, garbage.id, b"\xff not an entry")
    world.store.mark_dead(garbage.id, "undecodable")
    dry = world("repair", "--dry-run", "--json").json()
    assert dry["would_revive"] == [good.id]
    assert list(dry["refused"]) == [garbage.id]
    assert world.store.get(good.id).status == "dead"  # type: ignore[union-attr]
    done = world("repair", rc=1)
    assert f"parked again {good.id}" in done.stdout
    assert f"stays dead {garbage.id}: entry {garbage.id} can't be decoded" in done.stdout
    assert "1 parked again, 1 stay dead" in done.stdout
    assert world.store.get(good.id).status == "parked"  # type: ignore[union-attr]


def test_fleet_records_a_minimum_only_when_asked_never_above_this_version_nor_blind(
    worlds: dict[str, Cli],
) -> None:
    """No worker answers in this world (none runs): nothing says the fleet is new enough, so
    ``--yes`` alone records nothing; ``--force`` is a person's word that it is."""
    world = worlds["keys"]
    quick = ("--timeout", "0.2", "--rounds", "1")
    shown, newer, blind, unasked = world.many(
        ("fleet", "--json", *quick),
        ("fleet", "--minimum", "9.9"),
        ("fleet", "--minimum", "0.4", "--yes", *quick),
        ("fleet", "--minimum", "0.4", "--force", *quick),
    )
    said = shown.json()
    assert (said["this_version"], said["minimum"], said["envelope"]) == ("0.4", None, 2)
    assert newer.returncode == 1
    assert "newer than this version" in newer.stderr
    assert blind.returncode == 1
    assert "no worker answered ping" in blind.stderr
    assert "--force" in blind.stderr
    assert unasked.returncode == 1
    assert "add --yes" in unasked.stderr  # no terminal to ask on: nothing recorded
    assert world.res.runtime.fleet.minimum(fresh=True) is None
    recorded = world("fleet", "--minimum", "0.4", "--force", "--yes", "--json", *quick).json()
    assert (recorded["minimum"], recorded["envelope"]) == ("0.4", 3)
    assert world.res.runtime.fleet.recorded_at() is not None


def test_status_shows_the_entries_held_for_a_process_that_can_read_them(
    worlds: dict[str, Cli],
) -> None:
    """A drainer without its key gives an entry back held (``hold``): status counts it."""
    new_only, keys = worlds["new keys only"], worlds["keys"]
    entry = keys.park(1)
    new_only.res.drain()
    said = new_only("status", "--json").json()
    assert said["held"] == {"unknown_key": {"entries": 1, "oldest_parked_at": entry.parked_at}}
    human = new_only("status").stdout
    assert "held for a process that can read them: 1 unknown_key (oldest parked" in human


def test_a_person_may_replay_a_copy_marked_replayed_and_is_warned(
    worlds: dict[str, Cli],
) -> None:
    """The memory that judged it a copy may be wrong (a clock, a host): a person may send it,
    never a drain; the command says its task may run twice."""
    world = worlds["keys"]
    entry = world.park(1)
    copied = world.store.payload(entry.id)
    assert copied is not None
    assert world.res.drain().replayed == 1
    put_raw(world.store, entry.id, copied, breaker="payments", reason="breaker_open")
    refused = world("replay", entry.id, rc=1)  # found to be a copy: marked, not sent
    assert "is a copy of one already published" in refused.stderr
    assert world.store.get(entry.id).dead_reason == "replayed"  # type: ignore[union-attr]
    assert world.res.drain().replayed == 0
    sent = world("replay", entry.id, "--json")
    (done,) = sent.json()["replayed"]
    assert done["id"] == entry.id
    assert "its task runs twice" in done["warning"]
    assert f"Warning: replayed {entry.id}, but it was marked a copy" in sent.stderr
    assert world.store.get(entry.id) is None
