"""Celery's own machinery under the no-loss contract, with a real prefork worker: a soft and a
hard time limit, the body's own ``self.retry()`` and ``autoretry_for``, and a kept copy of a park
that the store refuses every time (``tests/support/matrix.py`` describes the world and the ledger).

Every test here fails on the code before these paths went through the package: a time limit
ended in FAILURE (the hard one acked the message), a refused ``self.retry()`` publish was
rejected without requeue, a probe that retried closed the breaker, and a kept copy ran the body
again at each redelivery, forever.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from .support.faults import acl_denied
from .support.matrix import SETTLE_TIMEOUT, USER, MatrixWorld, fresh, running_world
from .support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HANG = "30"  # the dependency's latency while it hangs (seconds): longer than any limit here
PARK_ATTEMPTS = 3


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[MatrixWorld]:
    tmp: Path = tmp_path_factory.mktemp("time-limits")
    with running_world(
        tmp,
        redis_url,
        "prefork",
        1,
        deduplicate=0,  # a duplicate run must show in the ledger
        open_timeout=1,
        park_attempts=PARK_ATTEMPTS,
        keep_delay=0.3,
        soft_time_limit=1,
        time_limit=2,
        visibility_timeout=60,
        store_msgpack=1,
    ) as world:
        yield world


@pytest.fixture(autouse=True)
def clean(world: MatrixWorld) -> Iterator[None]:
    fresh(world)
    world.ledger.set(f"{world.prefix}:dep:latency", "0")
    yield
    world.ledger.set(f"{world.prefix}:dep:latency", "0")
    world.heal()


def calls_of(world: MatrixWorld, task_id: str) -> int:
    """Calls the dependency got from ``task_id``'s bodies."""
    log = world.ledger.lrange(f"{world.prefix}:dep:log", 0, -1)
    return sum(1 for record in log if task_id.encode() in record)


def parked_entry(world: MatrixWorld, task_id: str) -> object:
    def found() -> object:
        entry = world.entries().get(task_id)
        return entry if entry is not None and not world.in_broker([task_id]) else None

    return wait_for(found, f"{task_id} parked and its message gone", 40.0)


def half_open(world: MatrixWorld) -> int:
    """Trip the shared breaker with real failures and wait until it may half-open; returns
    its trips so far (the counters outlive a reset)."""
    breaker = world.resilience.breaker("dep")

    def fail() -> None:
        raise ConnectionError("down")

    for _ in range(3):
        with pytest.raises(ConnectionError):
            breaker.call(fail)
    assert breaker.state == "open"
    wait_for(
        lambda: breaker.snapshot()["open_until"] <= time.time(),
        "the open time to pass",
        SETTLE_TIMEOUT,
    )
    return int(breaker.snapshot()["opened_total"])


# -- time limits --------------------------------------------------------------------------------


def test_a_soft_time_limit_on_a_hanging_call_is_retried_then_parked_and_counted(
    world: MatrixWorld,
) -> None:
    world.ledger.set(f"{world.prefix}:dep:latency", HANG)
    failures = world.resilience.breaker("dep").snapshot()["failures_total"]
    ids = world.publish(1, "soft", task="hang")
    entry = parked_entry(world, ids[0])
    assert entry.reason == "retries_exhausted"  # type: ignore[attr-defined]
    assert entry.exc_type.endswith("SoftTimeLimitExceeded")  # type: ignore[attr-defined]
    assert entry.retries == 1  # type: ignore[attr-defined]  # retried once, then parked
    assert calls_of(world, ids[0]) == 2
    snap = world.resilience.breaker("dep").snapshot()
    assert snap["failures_total"] - failures == 2, snap  # each hang is a failure of the dependency
    assert world.app.AsyncResult(ids[0]).state != "FAILURE"
    world.ledger.set(f"{world.prefix}:dep:latency", "0")
    world.settle("soft time limit / hanging call", ids).check()


def test_a_soft_time_limit_on_a_probe_reopens_the_breaker_at_once(world: MatrixWorld) -> None:
    trips = half_open(world)
    world.ledger.set(f"{world.prefix}:dep:latency", HANG)
    breaker = world.resilience.breaker("dep")
    ids = world.publish(1, "soft-probe", task="hang")
    # The probe's slot is settled as a failure, not held until its 60 s lease ends.
    wait_for(
        lambda: breaker.snapshot()["opened_total"] >= trips + 1, "the probe to trip the breaker", 15
    )
    # Not closed: open, or half-open again once its 1 s open time ran out (a slow host).
    assert breaker.state in ("open", "half_open")
    # Still hanging: the retry is parked whether it comes while the breaker is open or, on a
    # slow host, as the next probe (which the limit ends too); a recovered dependency would let
    # that probe succeed instead.
    parked_entry(world, ids[0])
    world.ledger.set(f"{world.prefix}:dep:latency", "0")
    world.settle("soft time limit / half-open probe", ids).check()


def test_a_hard_time_limit_retries_then_parks_and_never_acks_the_message_away(
    world: MatrixWorld,
) -> None:
    world.ledger.set(f"{world.prefix}:dep:latency", HANG)
    children = set(world.worker.children())
    failures = world.resilience.breaker("dep").snapshot()["failures_total"]
    ids = world.publish(1, "hard", task="stuck")
    entry = parked_entry(world, ids[0])
    assert entry.reason == "retries_exhausted"  # type: ignore[attr-defined]
    assert entry.exc_type == "billiard.exceptions.TimeLimitExceeded"  # type: ignore[attr-defined]
    assert calls_of(world, ids[0]) == 2  # killed twice: the first run, then its retry
    assert not children & set(world.worker.children())  # the pool child really was killed
    snap = world.resilience.breaker("dep").snapshot()
    assert snap["failures_total"] - failures == 2, snap
    assert world.app.AsyncResult(ids[0]).state != "FAILURE"
    log = world.worker.log()
    assert "Hard time limit (2.0s) exceeded" in log
    world.ledger.set(f"{world.prefix}:dep:latency", "0")
    world.settle("hard time limit / killed child", ids).check()


def test_a_hard_time_limit_on_a_probe_reopens_the_breaker_at_once(world: MatrixWorld) -> None:
    trips = half_open(world)
    world.ledger.set(f"{world.prefix}:dep:latency", HANG)
    breaker = world.resilience.breaker("dep")
    ids = world.publish(1, "hard-probe", task="stuck")
    # The killed probe's lease is settled as a failure, not held until its 60 s lease ends.
    wait_for(
        lambda: breaker.snapshot()["opened_total"] >= trips + 1, "the probe to trip the breaker", 15
    )
    # Not closed: open, or half-open again once its 1 s open time ran out (a slow host).
    assert breaker.state in ("open", "half_open")
    # Still hanging: the retry is parked whether it comes while the breaker is open or, on a
    # slow host, as the next probe (which the limit ends too); a recovered dependency would let
    # that probe succeed instead.
    parked_entry(world, ids[0])
    world.ledger.set(f"{world.prefix}:dep:latency", "0")
    world.settle("hard time limit / half-open probe", ids).check()


def test_a_hard_time_limit_whose_retry_the_broker_refuses_is_parked(world: MatrixWorld) -> None:
    world.ledger.set(f"{world.prefix}:dep:latency", HANG)
    with acl_denied(world.broker_admin, USER, ["-lpush"]):
        ids = world.publish(1, "hard-refused", task="stuck")
        entry = parked_entry(world, ids[0])
    assert entry.reason == "delay_too_long"  # type: ignore[attr-defined]
    assert calls_of(world, ids[0]) == 1
    world.ledger.set(f"{world.prefix}:dep:latency", "0")
    world.settle("hard time limit / retry refused", ids).check()


def test_a_hard_time_limit_whose_park_fails_keeps_a_copy_that_does_not_run_the_body(
    world: MatrixWorld,
) -> None:
    world.ledger.set(f"{world.prefix}:dep:latency", HANG)
    log_before = len(world.worker.log())
    rules = ["resetkeys", f"~{{{world.prefix}:breaker:*", f"~{world.prefix}:breakers"]
    with acl_denied(world.store_admin, USER, rules):
        ids = world.publish(1, "hard-park-refused", task="stuck")
        wait_for(lambda: world.failed(ids), "the task to give up", 40.0)
        wait_for(lambda: not world.in_broker(ids), "the last copy acked", 10.0)
    assert calls_of(world, ids[0]) == 2  # killed twice; the kept copies never ran the body
    log = world.worker.log()[log_before:]
    assert f"workerapp.stuck[{ids[0]}] kept (park failed" in log
    assert f"Gave up parking workerapp.stuck[{ids[0]}] after {PARK_ATTEMPTS} failed parks" in log
    world.ledger.set(f"{world.prefix}:dep:latency", "0")
    world.settle("hard time limit / park refused", ids).check(failed=1)


# -- the body's own retry -----------------------------------------------------------------------


@pytest.mark.parametrize("task", ["polite", "auto"])
def test_the_bodys_own_retry_that_the_broker_refuses_is_parked(
    world: MatrixWorld, task: str
) -> None:
    world.dependency(up=False)
    with acl_denied(world.broker_admin, USER, ["-lpush"]):
        ids = world.publish(2, f"own-retry-refused-{task}", task=task)
        entries = [parked_entry(world, t) for t in ids]
    assert {e.reason for e in entries} == {"delay_too_long"}  # type: ignore[attr-defined]
    world.settle(f"self.retry() ({task}) / broker refuses", ids).check()


def test_the_bodys_own_retry_runs_out_into_the_store(world: MatrixWorld) -> None:
    world.dependency(up=False)
    ids = world.publish(1, "own-retry-exhausted", task="polite")
    entry = parked_entry(world, ids[0])
    assert entry.reason == "retries_exhausted"  # type: ignore[attr-defined]
    assert calls_of(world, ids[0]) == 2
    world.settle("self.retry() / retries run out", ids).check()


def test_a_probe_whose_body_retries_a_retry_on_error_does_not_close_the_breaker(
    world: MatrixWorld,
) -> None:
    trips = half_open(world)
    world.dependency(up=False)
    breaker = world.resilience.breaker("dep")
    ids = world.publish(1, "own-retry-probe", task="polite")
    wait_for(
        lambda: calls_of(world, ids[0]) >= 1, "the probe to call the dependency", SETTLE_TIMEOUT
    )
    wait_for(
        lambda: breaker.snapshot()["opened_total"] >= trips + 1, "the probe to trip the breaker", 15
    )
    # Not closed: open, or half-open again once its 1 s open time ran out (a slow host).
    assert breaker.state in ("open", "half_open")
    parked_entry(world, ids[0])  # its retry finds the breaker open: parked
    world.settle("self.retry() / half-open probe", ids).check()


# -- a kept copy --------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["refused", "unencodable"])
def test_a_kept_copy_parks_without_running_the_body_and_gives_up_where_a_person_sees_it(
    world: MatrixWorld, fault: str
) -> None:
    world.dependency(up=False)
    log_before = len(world.worker.log())
    # "refused": the store refuses every write to the parked tasks' keys (the breakers' keys
    # stay usable); "unencodable": the store writes msgpack, which can't hold the datetime
    # these JSON messages carry: a park that can never succeed.
    rules = ["resetkeys", f"~{{{world.prefix}:breaker:*", f"~{world.prefix}:breakers"]
    refused = acl_denied(world.store_admin, USER, rules)
    with refused if fault == "refused" else contextlib.nullcontext():
        task_id = f"kept-{fault}-{uuid.uuid4().hex[:6]}"
        order = datetime(2026, 1, 1, 12, 0) if fault == "unencodable" else "kept"
        world.app.tasks["workerapp.charge"].apply_async((order,), task_id=task_id)
        ids = [task_id]
        wait_for(lambda: world.failed(ids), "the task to give up", 30.0)
        # No endless loop: the last copy is acked (just after its FAILURE is stored).
        wait_for(lambda: not world.in_broker(ids), "the last copy acked", 10.0)
    assert calls_of(world, task_id) == 2  # the first run and its retry; no kept copy ran it
    log = world.worker.log()[log_before:]
    assert f"Gave up parking workerapp.charge[{task_id}] after {PARK_ATTEMPTS} failed parks" in log
    assert "could not be parked" in str(world.app.AsyncResult(task_id).result)
    if fault == "unencodable":  # the counters are in the store: counted where it still writes
        stats = world.resilience.backout.stats()
        assert stats.get("unparkable|dep", 0) >= 1, stats
    world.settle(f"kept copy / every park fails ({fault})", ids).check(failed=1)
