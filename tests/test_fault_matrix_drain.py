"""The fault matrix, drain side: each step of a drain under each fault, with one real worker
that runs what the drains replay (``tests/support/matrix.py`` describes the world and the ledger).

Steps: the claim, decoding an entry, publishing a replay, the drain's ack. Faults: the
resilience Redis hung or answering NOPERM, OOM or READONLY at that very script (the proxy holds
the drainer there while the fault is applied); the broker refusing every publish, or one
entry's queue (ACLs); an entry that can't be decoded, or encoded for the broker; an entry whose
``expires`` passed while it was parked; ``kill -9`` of a drainer process at that step. Entries
are parked straight into the store (due now), as a worker would have. ``charge`` runs without
``deduplicate``: the ledger counts every body run and every message the broker took per id, and
each cell says how many it expects (one per id, none for a dead entry); the cells of a lost ack
show both ``charge`` (run twice) and ``charge_once`` (``deduplicate=True``: run once).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from celery_resilience import ParkedTask
from celery_resilience.drain import Drainer

from .support.faults import acl_denied, out_of_memory, read_only, script_sha
from .support.kombu_features import publishes_in_batches
from .support.matrix import SETTLE_TIMEOUT, USER, Ledger, MatrixWorld, fresh, running_world
from .support.raw_entries import put_raw
from .support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CLAIM = script_sha("backout/redis/lua/claim.lua")
ACK = script_sha("backout/redis/lua/delete.lua")
#: What only an ack's call of it names (the ready sets of the entries it removes): a drain pass
#: first calls it to forget what its memory no longer needs, with no entry.
ACKED = b":ready:"
LEASE = 2.0


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[MatrixWorld]:
    tmp: Path = tmp_path_factory.mktemp("matrix-drain")
    with running_world(tmp, redis_url, "solo") as world:
        yield world


@pytest.fixture(autouse=True)
def clean(world: MatrixWorld) -> Iterator[None]:
    """Every cell starts healed, with the dependency up and a fresh closed breaker."""
    fresh(world)
    yield
    world.heal()


def park(world: MatrixWorld, count: int, tag: str, **fields: Any) -> list[str]:
    """``count`` parked charges, due now, as a worker parks them when the breaker is open."""
    now = world.resilience.runtime.now()
    ids = []
    for i in range(count):
        task_id = f"{tag}-{i}-{time.monotonic_ns()}"
        values: dict[str, Any] = {
            "task_name": "workerapp.charge",
            "task_id": task_id,
            "reason": "breaker_open",
            "breaker": "dep",
            "args": [f"{tag}-{i}"],
            "options": {"queue": world.queue},
            "parked_at": now - 10,
            "due_at": now - 10,
        }
        values.update(fields)
        world.resilience.runtime.backout_store.park(ParkedTask.new(**values))
        ids.append(task_id)
    return ids


def drain_through_faults(world: MatrixWorld) -> Any:
    """One drain run as a beat-run drain does it: the ACL user, through the proxies."""
    resilience = world.drainer_app()
    try:
        return Drainer(resilience.runtime, lease=LEASE).run()
    finally:
        resilience.runtime.app.close()


def settle(world: MatrixWorld, cell: str, ids: list[str], during: dict[str, int]) -> Ledger:
    """Heal, then let drains (not replays by hand) bring every id home."""
    world.heal()

    def home() -> bool:
        world.resilience.drain()
        runs, entries = world.runs(), world.entries()
        return all(
            (runs.get(t) and t not in entries) or (t in entries and entries[t].status == "dead")
            for t in ids
        )

    wait_for(home, f"{cell}: every id replayed and run, or dead", SETTLE_TIMEOUT)
    return world.ledger_of(cell, ids, during)


def still_parked(world: MatrixWorld, ids: list[str]) -> dict[str, int]:
    snap = world.snapshot(ids)
    assert snap["parked"] == len(ids), snap  # nothing lost, nothing half done
    return snap


def kill(process: Any) -> None:
    os.kill(process.pid, signal.SIGKILL)
    process.wait(10)


# -- the claim ----------------------------------------------------------------------------------


def test_claim_with_redis_hung_reports_and_loses_nothing(world: MatrixWorld) -> None:
    ids = park(world, 3, "claim-hung")
    held = world.store_proxy.hold_on(CLAIM)
    report = drain_through_faults(world)
    assert held.is_set()
    assert (report.errors, report.replayed) == (1, 0)
    during = still_parked(world, ids)
    settle(world, "claim / Redis hung", ids, during).check(messages={})


@pytest.mark.parametrize("fault", ["NOPERM", "OOM", "READONLY"])
def test_claim_with_redis_answering_errors_reports_and_loses_nothing(
    world: MatrixWorld, fault: str
) -> None:
    ids = park(world, 3, f"claim-{fault}")
    if fault == "NOPERM":
        fault_cm: Any = acl_denied(world.store_admin, USER, ["-evalsha", "-eval"])
    elif fault == "OOM":
        fault_cm = out_of_memory(world.store_admin)
    else:
        fault_cm = read_only(world.store_admin)
    with fault_cm:
        report = drain_through_faults(world)
        assert (report.errors, report.replayed) == (1, 0)
        during = still_parked(world, ids)
    settle(world, f"claim / {fault}", ids, during).check(messages={})


def test_claim_with_the_drainer_killed_there_loses_nothing(world: MatrixWorld) -> None:
    ids = park(world, 3, "claim-kill")
    held = world.store_proxy.hold_on(CLAIM)
    drainer = world.start_drainer(LEASE)
    wait_for(held.is_set, "the drainer held at its claim", SETTLE_TIMEOUT)
    kill(drainer)
    world.store_proxy.release()
    during = still_parked(world, ids)
    settle(world, "claim / kill -9 drainer", ids, during).check(messages={})


# -- decoding an entry ----------------------------------------------------------------------------


def test_an_entry_that_cannot_be_decoded_is_quarantined_and_the_rest_drain(
    world: MatrixWorld,
) -> None:
    ids = park(world, 3, "decode")
    store = world.resilience.runtime.backout_store
    put_raw(store, "garbage-entry", b"\x00not an entry", breaker="dep")  # a corrupt write
    report = drain_through_faults(world)
    assert report.replayed == 3
    corrupt = world.resilience.backout.get("garbage-entry")
    assert corrupt is not None
    assert (corrupt.status, corrupt.dead_reason) == ("dead", "undecodable")
    settle(world, "decode / undecodable entry", ids, {"dead_undecodable": 1}).check(messages={})
    world.resilience.backout.delete("garbage-entry")


# -- publishing a replay ------------------------------------------------------------------------


def test_a_broker_refusing_every_publish_gives_the_entries_back(world: MatrixWorld) -> None:
    ids = park(world, 4, "publish-refused")
    with acl_denied(world.broker_admin, USER, ["-lpush"]):
        report = drain_through_faults(world)
    assert (report.replayed, report.dead, report.errors) == (0, 0, 1)
    during = still_parked(world, ids)
    settle(world, "replay publish / broker refuses all", ids, during).check(messages={})


def test_a_queue_the_broker_refuses_kills_that_entry_only(world: MatrixWorld) -> None:
    good = park(world, 3, "publish-one-refused")
    (bad,) = park(world, 1, "publish-forbidden", options={"queue": "forbidden-queue"})
    broker = f"{world.prefix}:broker:"
    rules = ["resetkeys", f"~{broker}{world.queue}*", f"~{broker}_kombu*", f"~{broker}unacked*"]
    with acl_denied(world.broker_admin, USER, rules):
        report = drain_through_faults(world)
    assert (report.replayed, report.dead) == (3, 1)
    entry = world.entries()[bad]
    assert entry.status == "dead"
    assert entry.dead_reason is not None
    assert entry.dead_reason.startswith("unpublishable: NoPermissionError")
    cell = "replay publish / broker refuses one queue"
    settle(world, cell, [*good, bad], {}).check(dead=1, messages={bad: 0})


def test_an_entry_that_cannot_be_encoded_for_the_broker_dies_alone(world: MatrixWorld) -> None:
    good = park(world, 3, "publish-encode")
    (bad,) = park(
        world, 1, "publish-unencodable", options={"queue": world.queue, "serializer": "gone"}
    )
    report = drain_through_faults(world)
    assert (report.replayed, report.dead, report.errors) == (3, 1, 0)
    assert str(world.entries()[bad].dead_reason).startswith("unpublishable: SerializerNotInstalled")
    cell = "replay publish / entry can't be encoded"
    settle(world, cell, [*good, bad], {}).check(dead=1, messages={bad: 0})


def test_an_entry_that_expired_while_parked_is_dead_not_published(world: MatrixWorld) -> None:
    past = (datetime.now(timezone.utc) - timedelta(minutes=5)).isoformat()
    future = (datetime.now(timezone.utc) + timedelta(hours=1)).isoformat()
    (old,) = park(world, 1, "expired", options={"queue": world.queue, "expires": past})
    fresh = park(world, 2, "not-expired", options={"queue": world.queue, "expires": future})
    report = drain_through_faults(world)
    assert (report.replayed, report.dead) == (2, 1)
    entry = world.entries()[old]
    assert (entry.status, entry.dead_reason) == ("dead", "expired")
    assert not world.in_broker([old])  # never sent: a worker would have revoked it
    cell = "replay publish / expired while parked"
    settle(world, cell, [old, *fresh], {}).check(dead=1, messages={old: 0})


def test_a_drainer_killed_mid_publish_loses_nothing(world: MatrixWorld) -> None:
    ids = park(world, 4, "publish-kill")
    held = world.broker_proxy.hold_on(ids[1].encode())  # the second entry's message
    drainer = world.start_drainer(LEASE)
    wait_for(held.is_set, "the drainer held while publishing", SETTLE_TIMEOUT)
    kill(drainer)
    world.broker_proxy.release()
    during = world.snapshot(ids)
    assert during["parked"] == len(ids)  # never acked: all still in the store
    ledger = settle(world, "replay publish / kill -9 drainer", ids, during)
    if publishes_in_batches(world.resilience):  # the batch was one transaction: none went out
        ledger.check(messages={})
        return
    # kombu < 5.7 publishes one by one: the entries sent before the kill (before the held one,
    # and after it once its publish timed out) run again when the next drain replays them: each
    # had two messages, the others one, and none is lost.
    again = ledger.duplicated
    ledger.check(duplicates=len(again), messages=dict.fromkeys(again, 2))


# -- the drain's ack ------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["charge", "charge_once"])
def test_an_ack_lost_to_a_hung_redis_publishes_again(world: MatrixWorld, task: str) -> None:
    """Published, then the ack is lost: the next drain publishes again (at least once). The
    body runs twice, unless the task has ``deduplicate=True``."""
    ids = park(world, 3, f"ack-hung-{task}", task_name=f"workerapp.{task}")
    held = world.store_proxy.hold_on(ACK, ACKED)
    report = drain_through_faults(world)
    assert held.is_set()
    assert report.errors == 1
    world.store_proxy.reset()  # the held ack is dropped with its connection: it never ran
    wait_for(lambda: set(ids) <= set(world.runs()), "the published replays to run", SETTLE_TIMEOUT)
    during = world.snapshot(ids)
    # Published, run, and still in the store: the next drain (after the lease) publishes them
    # again, and deduplicate=True skips them at admission.
    assert during["parked"] == 3
    ledger = settle(world, f"drain ack / Redis hung ({task})", ids, during)
    ledger.check(duplicates=3 if task == "charge" else 0, messages=dict.fromkeys(ids, 2))


@pytest.mark.parametrize("task", ["charge", "charge_once"])
def test_a_drainer_killed_at_its_ack_publishes_again(world: MatrixWorld, task: str) -> None:
    ids = park(world, 3, f"ack-kill-{task}", task_name=f"workerapp.{task}")
    held = world.store_proxy.hold_on(ACK, ACKED)
    drainer = world.start_drainer(LEASE)
    wait_for(held.is_set, "the drainer held at its ack", SETTLE_TIMEOUT)
    kill(drainer)
    world.store_proxy.release()
    during = world.snapshot(ids)
    assert during["parked"] == 3
    ledger = settle(world, f"drain ack / kill -9 drainer ({task})", ids, during)
    ledger.check(duplicates=3 if task == "charge" else 0, messages=dict.fromkeys(ids, 2))
