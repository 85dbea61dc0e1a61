"""The fault matrix, worker side: each step of a delivery under each fault, with one real
prefork worker for the whole module (``tests/support/matrix.py`` describes the world and the
ledger).

Steps: admission, the body, publishing a retry, writing the park entry, the ack. Faults: the
resilience Redis hung (a blackholing proxy) or answering NOPERM (an ACL), OOM (maxmemory) or
READONLY (REPLICAOF); the broker refusing a publish (an ACL without LPUSH); an entry that can't
be encoded; a reply lost after the script ran; ``kill -9`` of the pool child, or of the whole
worker, held at that very step by the proxy. Every fault is real; nothing is patched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from .support.faults import acl_denied, out_of_memory, read_only, script_sha
from .support.kombu_features import restore_unacked, restores_unacked_when_asked
from .support.matrix import SETTLE_TIMEOUT, USER, MatrixWorld, fresh, running_world
from .support.waiting import wait_for
from .support.worker_process import alive

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ACQUIRE = script_sha("breaker/lua/acquire.lua")
PARK = script_sha("backout/redis/lua/park.lua")
#: The broker's visibility timeout (s) in this module's world.
VISIBILITY_TIMEOUT = 5


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[MatrixWorld]:
    tmp: Path = tmp_path_factory.mktemp("matrix-worker")
    with running_world(
        tmp,
        redis_url,
        "prefork",
        1,
        store_msgpack=1,
        restore_interval=1,
        visibility_timeout=VISIBILITY_TIMEOUT,
    ) as world:
        yield world


@pytest.fixture(autouse=True)
def clean(world: MatrixWorld) -> Iterator[None]:
    """Every cell starts healed, with the dependency up and a fresh closed breaker."""
    fresh(world)
    yield
    world.heal()


def parked(world: MatrixWorld, ids: list[str]) -> dict[str, int]:
    """Wait until every id is parked (and its message gone); where they are then."""

    def done() -> dict[str, int] | None:
        if world.tap.pending(ids):  # a message not acked yet (requeued, restored, running)
            return None
        snap = world.snapshot(ids)
        return snap if snap["parked"] == len(ids) and not snap["in_broker"] else None

    result: dict[str, int] = wait_for(done, "every id parked", SETTLE_TIMEOUT)
    return result


def kept(world: MatrixWorld, ids: list[str], messages: int) -> dict[str, int]:
    """Wait until the broker took ``messages`` messages for each id (the test's own, then a
    retry or kept copies: each round of "park refused, kept in the broker" publishes one) and
    then sees every id in it; where the ids are then. Waiting for both (not sleeping) keeps a
    loaded machine from reading too early, or between a kept copy's publish and its ack."""
    wait_for(
        lambda: min(world.tap.messages(ids).values()) >= messages,
        f"{messages} messages for each id (kept in the broker, again and again)",
        SETTLE_TIMEOUT,
    )

    def all_in_broker() -> dict[str, int] | None:
        snap = world.snapshot(ids)
        return snap if snap["in_broker"] == len(ids) else None

    result: dict[str, int] = wait_for(all_in_broker, "every id in the broker", SETTLE_TIMEOUT)
    return result


def child(world: MatrixWorld) -> int:
    return int(wait_for(world.worker.children, "a pool child", SETTLE_TIMEOUT)[0])


# -- admission ------------------------------------------------------------------------------


def test_admission_with_redis_hung_runs_the_task_fail_open(world: MatrixWorld) -> None:
    world.store_proxy.blackhole()
    ids = world.publish(3, "adm-hung")
    crash = world.publish(1, "adm-hung-crash", task="crash")
    wait_for(lambda: len(world.runs().keys() & set(ids)) == 3, "the tasks to run", SETTLE_TIMEOUT)
    wait_for(lambda: world.failed(crash), "the crash to fail in its own code", SETTLE_TIMEOUT)
    during = world.snapshot(ids + crash)
    world.heal()
    world.settle("admission / Redis hung", ids + crash, during).check(failed=1)


@pytest.mark.parametrize("fault", ["NOPERM", "OOM", "READONLY"])
def test_admission_with_redis_answering_errors_runs_the_task_fail_open(
    world: MatrixWorld, fault: str
) -> None:
    with _redis_error(world, fault):
        ids = world.publish(3, f"adm-{fault}")
        wait_for(
            lambda: len(world.runs().keys() & set(ids)) == 3, "the tasks to run", SETTLE_TIMEOUT
        )
        during = world.snapshot(ids)
    world.settle(f"admission / {fault}", ids, during).check()


def test_admission_with_the_child_killed_there_redelivers(world: MatrixWorld) -> None:
    world.force_open()  # admission then asks Redis (acquire.lua)
    held = world.store_proxy.hold_on(ACQUIRE)
    ids = world.publish(1, "adm-kill")
    wait_for(held.is_set, "the child held in admission", SETTLE_TIMEOUT)
    world.worker.kill_child(child(world))
    world.store_proxy.release()
    during = parked(world, ids)  # redelivered, admitted again, parked as breaker_open
    world.settle("admission / kill -9 child", ids, during).check()


# -- the body ---------------------------------------------------------------------------------


def test_body_with_the_child_killed_runs_again(world: MatrixWorld) -> None:
    world.ledger.set(f"{world.prefix}:dep:latency", "3")
    calls = f"{world.prefix}:dep:calls"
    before = int(world.ledger.get(calls) or 0)
    ids = world.publish(1, "body-kill")
    wait_for(
        lambda: int(world.ledger.get(calls) or 0) > before, "the body to start", SETTLE_TIMEOUT
    )
    world.worker.kill_child(child(world))
    world.ledger.set(f"{world.prefix}:dep:latency", "0")
    wait_for(lambda: world.runs().get(ids[0]), "the task to run again and succeed", SETTLE_TIMEOUT)
    world.settle("body / kill -9 child", ids).check()


# -- publishing a retry ---------------------------------------------------------------------


def test_a_retry_the_broker_refuses_is_parked(world: MatrixWorld) -> None:
    world.dependency(up=False)
    with acl_denied(world.broker_admin, USER, ["-lpush"]):
        ids = world.publish(3, "retry-refused")
        during = parked(world, ids)
    reasons = {e.reason for t, e in world.entries().items() if t in ids}
    assert reasons == {"delay_too_long"}  # held in the store until the retry would have run
    world.settle("retry publish / broker refuses", ids, during).check()


def test_a_retry_and_a_park_both_refused_leave_the_message_unacked(world: MatrixWorld) -> None:
    # The broker takes no publish (the retry, the kept copy, even the requeue: all LPUSH) and
    # the store no park: the message is never rejected, it stays in kombu's ``unacked`` until
    # the broker's visibility sweep brings it back, after the faults are healed. (kombu's
    # refused requeue is an "unrecoverable error" for Celery: the worker exits, as a
    # supervisor would restart it; the message stays safe meanwhile.)
    world.dependency(up=False)
    rules = ["resetkeys", f"~{{{world.prefix}:breaker:*", f"~{world.prefix}:breakers"]
    with (
        acl_denied(world.broker_admin, USER, ["-lpush"]),
        acl_denied(world.store_admin, USER, rules),
    ):
        ids = world.publish(2, "retry-park-refused")
        wait_for(
            lambda: "in the broker either" in world.worker.log(),
            "a keep refused too",
            SETTLE_TIMEOUT,
        )
        during = kept(world, ids, 1)  # nothing more could be published
        assert during["parked"] == 0
    restart(world)
    sweep_on_old_kombu(world)
    world.settle("retry publish + park / broker and store refuse", ids, during).check()


# -- writing the park entry -------------------------------------------------------------------


def test_a_park_refused_with_noperm_keeps_the_message_in_the_broker(world: MatrixWorld) -> None:
    world.force_open()
    rules = ["resetkeys", f"~{{{world.prefix}:breaker:*", f"~{world.prefix}:breakers"]
    with acl_denied(world.store_admin, USER, rules):
        ids = world.publish(3, "park-noperm")
        during = kept(world, ids, 3)  # two rounds of "park refused, kept in the broker"
        assert during["parked"] == 0
    world.settle("park / NOPERM", ids, during).check()


@pytest.mark.parametrize("fault", ["OOM", "READONLY", "hung"])
def test_an_exhausted_task_whose_park_fails_stays_in_the_broker(
    world: MatrixWorld, fault: str
) -> None:
    world.dependency(up=False)
    with _redis_error(world, fault):
        ids = world.publish(2, f"park-{fault}")
        during = kept(world, ids, 4)  # the retry, then two rounds of "kept in the broker"
        assert during["parked"] == 0
    world.settle(f"park / {fault}", ids, during).check()


def test_an_entry_that_cannot_be_encoded_keeps_the_message(world: MatrixWorld) -> None:
    # The store writes msgpack, which can't hold the datetime these JSON messages carry.
    world.force_open()
    ids = []
    for i in range(2):
        task_id = f"park-encode-{i}-{time.monotonic_ns()}"
        order = datetime(2026, 1, 1, 12, i)
        world.app.tasks["workerapp.charge"].apply_async((order,), task_id=task_id)
        ids.append(task_id)
    during = kept(world, ids, 3)
    assert during["parked"] == 0
    world.settle("park / entry can't be encoded", ids, during).check()


def test_a_child_killed_while_parking_parks_once(world: MatrixWorld) -> None:
    world.force_open()
    held = world.store_proxy.hold_on(PARK)
    ids = world.publish(1, "park-kill")
    wait_for(held.is_set, "the child held in its park", SETTLE_TIMEOUT)
    world.worker.kill_child(child(world))
    world.store_proxy.release()
    during = parked(world, ids)
    world.settle("park / kill -9 child", ids, during).check()


def test_a_park_whose_reply_is_lost_parks_once(world: MatrixWorld) -> None:
    world.force_open()
    cut = world.store_proxy.cut_reply_on(PARK)
    ids = world.publish(2, "park-cut")
    wait_for(cut.is_set, "a park whose reply was cut", SETTLE_TIMEOUT)
    during = parked(world, ids)
    assert len(world.resilience.backout.list(limit=1000)) >= 2
    world.settle("park / reply lost", ids, during).check()


# -- the ack ------------------------------------------------------------------------------------


def test_a_worker_killed_between_park_and_ack_parks_once(world: MatrixWorld) -> None:
    """The last cell: it kills the worker and starts another."""
    world.force_open()
    ids = world.publish(1, "ack-kill")
    # The park is stored; the ack (HDEL of the message from kombu's ``unacked``) is held.
    held = world.broker_proxy.hold_on(b"HDEL")
    wait_for(lambda: ids[0] in world.entries(), "the park", SETTLE_TIMEOUT)
    wait_for(held.is_set, "the worker's ack held", SETTLE_TIMEOUT)
    restart(world)  # kill -9 of the worker's main process and its pool child, a new worker
    world.broker_proxy.release()  # the dead worker's ack is gone with its connection
    # Handled: parked again (``ignored``) by the new worker. Not "gone from the broker": kombu
    # restores a message in two steps (out of ``unacked``, then into the queue), and a look in
    # between sees it nowhere.
    redelivered = f"[{ids[0]}] ignored"
    # Never acked: still in kombu's ``unacked``, or already restored to the new worker when its
    # start on a busy host took longer than the visibility timeout.
    wait_for(
        lambda: world.in_broker(ids) or redelivered in world.worker.log(),
        "the unacked message in the broker or redelivered",
        SETTLE_TIMEOUT,
    )
    sweep_on_old_kombu(world)
    # The message was never acked: restored after the visibility timeout, it parks onto the
    # same entry (its id comes from task id, replays and retries).
    wait_for(lambda: redelivered in world.worker.log(), "the redelivered message parked", 30.0)
    wait_for(lambda: not world.in_broker(ids), "the redelivered message acked", SETTLE_TIMEOUT)
    during = world.snapshot(ids)
    assert during["parked"] == 1
    world.settle("ack / kill -9 worker", ids, during).check()


def restart(world: MatrixWorld) -> None:
    """kill -9 the worker (main process and pool child) and start another."""
    kill_worker(world)
    world.start_worker("prefork", 1)


def sweep_on_old_kombu(world: MatrixWorld) -> None:
    """Before kombu 5.7 a worker looks for unacked messages whose visibility timeout ran out
    only every 100 s (``unacked_restore_interval`` is 5.7's): the test looks once itself, as
    that sweep would, once the timeout ran out."""
    if not restores_unacked_when_asked():
        time.sleep(VISIBILITY_TIMEOUT)
        restore_unacked(world.app)


def kill_worker(world: MatrixWorld) -> None:
    """kill -9 the main process and its pool child, and wait until both are gone: the child
    holds the broker connection it inherited, which closes only with the last of them."""
    old = world.worker
    pids = [old.pid, *old.children()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert old.process is not None
    old.process.wait(10.0)
    wait_for(
        lambda: not any(alive(pid) for pid in pids),
        "the killed worker's processes gone",
        SETTLE_TIMEOUT,
    )


def _redis_error(world: MatrixWorld, fault: str):  # type: ignore[no-untyped-def]
    if fault == "NOPERM":
        return acl_denied(world.store_admin, USER, ["-evalsha", "-eval"])
    if fault == "OOM":
        return out_of_memory(world.store_admin)
    if fault == "READONLY":
        return read_only(world.store_admin)
    return _hung(world)


class _hung:
    def __init__(self, world: MatrixWorld) -> None:
        self.world = world

    def __enter__(self) -> None:
        self.world.store_proxy.blackhole()

    def __exit__(self, *exc: object) -> None:
        self.world.store_proxy.release()
