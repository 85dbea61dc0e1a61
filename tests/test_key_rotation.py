"""Key rotation while the fleet works: ``rotate-keys`` racing a drain (real CLI processes, on
the Redis store and on the database store in PostgreSQL), then the old key dropped.

A rotation must rewrite every entry that exists from its start to its end, whatever drains and
discards do meanwhile: once the old key is gone, an entry it passed over would be ``tampered``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from celery import Celery

from celery_resilience import ParkedTask, Resilience
from celery_resilience.backout import Codec, Filter
from celery_resilience.backout.store import BackoutStore
from tests.support import django_settings
from tests.support.cli import CLI_TIMEOUT, Cli, Result
from tests.support.waiting import wait_for
from tests.support.worker_process import ROOT

pytestmark = pytest.mark.integration

OLD = "rotation-old-key-" + "o" * 20
NEW = "rotation-new-key-" + "n" * 20
#: Entries of each breaker: ``search`` is drained during the rotation, ``payments`` held open.
EACH = 500
#: The drain's pace: long enough that the whole rotation runs while it acks entries.
PACED = {"resilience_drain_rate": 100.0, "resilience_drain_batch": 10}


def world(cli: Cli, keys: list[str], **env: str) -> Cli:
    """The same world (prefix, queue) with these signing keys and the drain's pace."""
    conf = {"CLIAPP_KEYS": json.dumps({"signing": keys}), "CLIAPP_CONF": json.dumps(PACED)}
    return Cli({**cli.env, **env, **conf}, cli.client)


def park_interleaved(store: BackoutStore) -> list[ParkedTask]:
    """``EACH`` entries of each breaker, parked one after the other (a drain of ``search`` then
    takes entries from all through the store's order)."""
    entries = []
    base = time.time() - 10_000
    for n in range(2 * EACH):
        breaker = "search" if n % 2 else "payments"
        entry = ParkedTask.new(
            task_name="cliapp.lookup" if n % 2 else "cliapp.charge",
            task_id=f"rotation-{n}",
            reason="breaker_open",
            breaker=breaker,
            args=[f"order-{n}"],
            parked_at=base + n,
        )
        store.park(entry)
        entries.append(entry)
    return entries


def race(rotated: Cli, store: BackoutStore) -> tuple[Result, Result]:
    """A drain of ``search`` and, once it acks entries, a rotation: both real CLI processes."""
    drain = rotated._start(("drain", "--breaker", "search", "--json"))
    wait_for(lambda: store.count(Filter(breaker="search")) < EACH, "the drain to ack entries", 60)
    rotation = rotated.many(("rotate-keys", "--batch", "5", "--json"))[0]
    out, err = drain.communicate(timeout=CLI_TIMEOUT)
    return rotation, Result(("drain",), drain.returncode, out, err)


def assert_every_entry_left_reads_with_the_new_key_alone(
    rotation: Result, drained: Result, new_only: BackoutStore
) -> None:
    assert drained.returncode == 0, str(drained)
    left = new_only.list(limit=10 * EACH)
    assert len(left) >= EACH  # payments' entries, held open, all stayed
    passed_over = [e.id for e in left if e.status != "parked" or e.dead_reason]
    assert passed_over == [], f"{len(passed_over)} of {len(left)} entries were not rewritten"
    assert rotation.returncode == 0, str(rotation)
    report = rotation.json()
    assert (report["refused"], report["not_rewritten"]) == ({}, [])
    assert drained.json()["replayed"] > 0


def test_a_rotation_racing_a_drain_rewrites_every_entry_of_the_redis_store(cli: Cli) -> None:
    old, rotated, new_only = world(cli, [OLD]), world(cli, [NEW, OLD]), world(cli, [NEW])
    try:
        park_interleaved(old.store)
        old.res.breaker("payments").force_open()
        rotation, drained = race(rotated, old.store)
        assert_every_entry_left_reads_with_the_new_key_alone(rotation, drained, new_only.store)
    finally:
        for made in (old, rotated, new_only):
            made.res.runtime.close()


@pytest.fixture
def postgresql(request: pytest.FixtureRequest) -> Iterator[str]:
    """The name of the suite's PostgreSQL test database of the contract alias, emptied."""
    django_settings.ensure_test_database("postgresql", request.config)
    from django.db import connections

    django_settings.clear("postgresql")
    yield str(connections["postgresql"].settings_dict["NAME"])
    django_settings.clear("postgresql")


def test_a_rotation_racing_a_drain_rewrites_every_entry_of_the_database_store(
    cli: Cli, postgresql: str
) -> None:
    from celery_resilience.contrib.django.store import DjangoBackoutStore

    keyed = world(cli, [NEW, OLD], CLIAPP_PG_NAME=postgresql)
    rotated = DjangoCli(keyed.env, keyed.client)
    old_store = DjangoBackoutStore(using="postgresql", codec=Codec("json", (OLD,)))
    new_only = DjangoBackoutStore(using="postgresql", codec=Codec("json", (NEW,)))
    app = Celery("rotation-test", set_as_current=False)
    app.conf.update(cli.app.conf)
    app.conf.resilience_signing_key = OLD
    res = Resilience(app, backout=old_store)
    try:
        park_interleaved(old_store)
        res.breaker("payments").force_open()
        rotation, drained = race(rotated, old_store)
        assert_every_entry_left_reads_with_the_new_key_alone(rotation, drained, new_only)
    finally:
        res.runtime.close()
        rotated.res.runtime.close()


class DjangoCli(Cli):
    """The CLI of the database store's app (``tests.apps.djangocliapp``)."""

    def _start(self, args: tuple[str, ...]) -> subprocess.Popen[str]:
        command = [sys.executable, "-m", "celery", "-A", "tests.apps.djangocliapp"]
        return subprocess.Popen(
            [*command, "resilience", *args],
            cwd=ROOT,
            env={**os.environ, **self.env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
