"""The CLI with the store's keys: what it shows where a key is missing, what it says of
untrusted entries, and ``rotate-keys`` (real ``celery resilience`` subprocesses)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis
from cryptography.fernet import Fernet

from celery_resilience.backout import Codec
from tests import test_cli
from tests.support.raw_entries import put_raw
from tests.test_cli import Cli

pytestmark = pytest.mark.integration

SIGNING = "cli-signing-key-" + "a" * 20
NEW_SIGNING = "cli-signing-key-" + "b" * 20
FERNET = Fernet.generate_key().decode()
NEW_FERNET = Fernet.generate_key().decode()

#: The CLI suite's fixture: its own key prefix and queue.
cli = test_cli.cli


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
    assert [(e["status"], e["dead_reason"]) for e in listed] == [("dead", "unsigned")]
    assert "dead (unsigned)" in world("list").stdout
    shown = world("show", forged.id).stdout
    assert "<unverified>" in shown
    assert "evil" not in shown


def test_rotate_keys_re_signs_and_re_encrypts_every_entry(
    worlds: dict[str, Cli], redis_client: redis.Redis
) -> None:
    entries = [worlds["keys"].park(n) for n in range(3)]
    done = worlds["rotated"]("rotate-keys", "--batch", "2", "--json").json()
    assert done == {"rewritten": 3, "changed_meanwhile": 0, "refused": {}}
    fresh = worlds["new keys only"]
    assert [e.args for e in fresh.store.list()] == [["order-2"], ["order-1"], ["order-0"]]
    assert {e.id for e in fresh.store.list()} == {e.id for e in entries}


def test_rotate_keys_leaves_what_it_cannot_trust_and_says_so(worlds: dict[str, Cli]) -> None:
    world = worlds["keys"]
    legacy = world.park(1)
    put_raw(world.store, legacy.id, Codec("json").encode(legacy))
    refused = world("rotate-keys", "--json", rc=1).json()
    assert refused == {"rewritten": 0, "changed_meanwhile": 0, "refused": {"unsigned": 1}}
    adopted = world("rotate-keys", "--adopt-unsigned", "--json").json()
    assert adopted["rewritten"] == 1
    assert world.store.get(legacy.id) == legacy
