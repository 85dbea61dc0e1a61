"""Adopting unsigned entries (``rotate-keys --adopt-unsigned``) with a pickle store: nothing is
unpickled to sign it, only what a person selects is signed, and only once they said yes (real
``celery resilience`` processes)."""

from __future__ import annotations

import json
import pickle
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import Cli
from tests.support.raw_entries import put_raw

pytestmark = pytest.mark.integration

KEY = "adopt-signing-key-" + "k" * 20


class Planted:
    """A body whose unpickling creates a file: code run in whoever unpickles it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def test_adopting_unsigned_entries_never_unpickles_and_never_signs_a_pickled_body(
    cli: Cli, tmp_path: Path
) -> None:
    """Nobody can see what a pickled body holds without running it: it is refused (exit 1),
    left unsigned and never unpickled, whatever time a person picked."""
    conf = json.dumps({"resilience_serializer": "pickle"})
    world = Cli({**cli.env, "CLIAPP_KEYS": json.dumps({"signing": [KEY]}), "CLIAPP_CONF": conf},
                cli.client)  # fmt: skip
    try:
        marker = tmp_path / "unpickled"
        cutoff = time.time() - 100
        old, late = "a" * 32, "b" * 32
        body = b"2;pickle;-\n" + pickle.dumps(Planted(marker))
        put_raw(world.store, old, body, breaker="payments", parked_at=cutoff - 50)
        put_raw(world.store, late, body, breaker="payments", parked_at=cutoff + 50)
        before = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(cutoff))
        adopt = ("rotate-keys", "--adopt-unsigned", "--parked-before", before)
        done = world(*adopt, "--yes", "--json", rc=1)
        assert done.json() == {"signed": 0, "revived": 0, "changed": [], "refused": [old]}
        said = world(*adopt, "--yes", rc=1).stdout
        assert "a pickled body is never adopted" in said
        assert not marker.exists(), "adoption unpickled a body"
        assert world.store.payload(old) == body  # left unsigned: a drain quarantines it
        assert world.store.payload(late) == body
    finally:
        world.res.runtime.close()


def test_adopting_signs_only_the_json_entries_a_person_picked(cli: Cli) -> None:
    from celery_resilience.backout import Codec, ParkedTask

    world = Cli({**cli.env, "CLIAPP_KEYS": json.dumps({"signing": [KEY]})}, cli.client)
    try:
        cutoff = time.time() - 100
        old, late = (
            ParkedTask.new(task_name="cliapp.charge", task_id=f"t-{n}", reason="breaker_open",
                           breaker="payments", args=[n], parked_at=cutoff + n)
            for n in (-50, 50)
        )  # fmt: skip
        for entry in (old, late):
            put_raw(world.store, entry.id, Codec("json").encode(entry), breaker="payments",
                    reason="breaker_open", parked_at=entry.parked_at)  # fmt: skip
        before = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(cutoff))
        adopt = ("rotate-keys", "--adopt-unsigned", "--parked-before", before)
        asked = world(*adopt, rc=1)
        assert "add --yes" in asked.stderr  # no terminal to ask on: nothing done
        done = world(*adopt, "--yes", "--json").json()
        assert done == {"signed": 1, "revived": 0, "changed": [], "refused": []}
        signed = world.store.payload(old.id)
        assert signed is not None
        assert signed.startswith(b"2;json;")
        assert not signed.startswith(b"2;json;-")
        assert world.store.get(old.id) == old  # it verifies now, as it was
        assert world.store.payload(late.id) == Codec("json").encode(late)  # after the time
    finally:
        world.res.runtime.close()


def test_what_an_adoption_shows_of_a_body_is_masked_and_escaped(cli: Cli) -> None:
    from celery_resilience.adopt import candidates
    from celery_resilience.backout import Codec, ParkedTask
    from celery_resilience.backout.masking import Masking

    world = Cli({**cli.env, "CLIAPP_KEYS": json.dumps({"signing": [KEY]})}, cli.client)
    try:
        planted = ParkedTask.new(
            task_name="cliapp.charge\x1b]52;c;evil\x07",
            task_id="t-1",
            reason="breaker_open",
            kwargs={"card_token": "tok_visa"},
            parked_at=time.time() - 500,
        )
        put_raw(world.store, planted.id, Codec("json").encode(planted), parked_at=time.time() - 500)
        (found,) = candidates(world.store, before=time.time())
        line = found.summary(Masking(keys=("card_token",)))
        assert f"{planted.id} parked_at=" in line
        assert " parked: claims " in line  # its status as stored: it is not dead (yet)
        assert "tok_visa" not in line
        assert "\x1b" not in line
        assert line.endswith("(unverified)")
    finally:
        world.res.runtime.close()
