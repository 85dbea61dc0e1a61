"""``ResilientTask`` in real ``celery worker`` processes, against real Redis and RabbitMQ.

Each test builds a world of its own (``tests/apps/workerapp.py``): a key prefix holding the breaker,
the back-out store, the fake dependency, the result keys and the Redis broker's keys, and a
queue nobody else consumes. Every test keeps a ledger: each published task id must end in
exactly one of succeeded (``<P>:ledger:succeeded``), parked (the back-out store) or, for the
tests that expect it, a Celery FAILURE.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import celery
import pytest

from celery_resilience.config import native_delayed_delivery

from .apps.workerapp import broker_keyprefix
from .support.redis_server import free_port
from .support.services import service_missing
from .support.waiting import wait_for
from .support.worker_process import WorkerProcess
from .support.worker_world import World

pytestmark = [pytest.mark.integration, pytest.mark.slow]

AMQP_URL = os.environ.get("RESILIENCE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
#: Time a retry may take beyond its countdown: the retry's publish, the worker's ETA timer,
#: the delivery and the next attempt's start, on a busy 2-core machine (a bound on lateness, not
#: a measure of this host's speed: the lower bound is what shows the retry waited).
SCHEDULING_SLACK = 3.0
RETRY_LOG = re.compile(r"Task workerapp\.charge\[([0-9a-f-]+)\] retry (\d+)/\S+ in ([0-9.]+)s")


def attempts_by_task(world: World) -> dict[str, list[dict[str, Any]]]:
    calls: dict[str, list[dict[str, Any]]] = {}
    for record in world.dep_log():
        calls.setdefault(record["task_id"], []).append(record)
    return calls


def countdowns_logged(logs: str) -> dict[tuple[str, int], float]:
    """(task id, retry number) -> the countdown the task chose, from the worker's log."""
    return {(t, int(n)): float(c) for t, n, c in RETRY_LOG.findall(logs)}


def require_rabbitmq(url: str = AMQP_URL) -> None:
    """Skip where RabbitMQ is not running (a contributor's machine); fail in CI, which has it."""
    where = urlparse(url)
    try:
        socket.create_connection((where.hostname, where.port or 5672), timeout=1).close()
    except OSError as exc:
        service_missing(f"no RabbitMQ at {where.hostname}:{where.port or 5672} ({exc})")


# -- 1. backoff, one breaker for the fleet, recovery -------------------------------------------
@pytest.mark.parametrize(("pool", "concurrency"), [("solo", 1), ("prefork", 2)])
def test_dependency_down_retries_with_jitter_then_trips_breaker_once_and_parks(
    make_world: Callable[..., World], pool: str, concurrency: int
) -> None:
    world = make_world(failure_threshold=3, open_timeout=60, max_retries=4, backoff_base=0.2)
    worker = world.start_worker(pool, concurrency)

    retries_are_jittered_and_spaced(world, worker, base=0.2, cap=5.0, max_retries=4)
    breaker_trips_once_then_parks_without_calling(world, worker, concurrency)
    recovered = tasks_succeed_once_dependency_is_back(world)

    counts = world.assert_ledger()
    assert counts["succeeded"] == len(recovered)


def retries_are_jittered_and_spaced(
    world: World, worker: WorkerProcess, base: float, cap: float, max_retries: int
) -> None:
    """(a) Given a breaker held closed, when the dependency is down, then each task retries
    ``max_retries`` times, each delay drawn in [0, min(cap, base * 2**n)] and really waited."""
    breaker = world.resilience.breaker("dep")
    breaker.force_closed()
    world.dependency(up=False)
    spaced = [world.publish("charge", f"a-{i}") for i in range(4)]
    exhausted = world.wait_parked(spaced)
    assert {e.reason for e in exhausted.values()} == {"retries_exhausted"}

    chosen = countdowns_logged(worker.log())
    attempts = attempts_by_task(world)
    delays: dict[int, list[float]] = {n: [] for n in range(max_retries)}
    lateness = []
    for task_id in spaced:
        calls = attempts[task_id]
        assert [c["retries"] for c in calls] == list(range(max_retries + 1))
        for n in range(max_retries):
            bound = min(cap, base * 2**n)
            countdown = chosen[(task_id, n + 1)]
            observed = calls[n + 1]["time"] - calls[n]["time"]
            assert 0.0 <= countdown <= bound + 0.005  # the log rounds to 10 ms
            assert countdown - 0.005 <= observed <= countdown + SCHEDULING_SLACK
            assert observed <= bound + SCHEDULING_SLACK
            delays[n].append(countdown)
            lateness.append(observed - countdown)
    mean = {n: round(sum(d) / len(d), 3) for n, d in delays.items()}
    print(f"mean countdown per retry: {mean}; latest retry {max(lateness):.3f}s late")
    # Full jitter: the bound doubles each retry; over 4 tasks, the last retries' countdowns are
    # longer than the first's (the chosen ones: a late delivery would blur the observed delays;
    # failing by chance has a probability below 1e-3).
    assert mean[max_retries - 1] > mean[0]
    assert breaker.snapshot()["opened_total"] == 0  # forced closed: nothing tripped


def breaker_trips_once_then_parks_without_calling(
    world: World, worker: WorkerProcess, concurrency: int
) -> None:
    """(b) Given a fresh closed breaker, when failures come from every pool process, then it
    opens exactly once and later deliveries park without calling the dependency."""
    breaker = world.resilience.breaker("dep")
    breaker.reset()
    world.dependency(up=False, latency=0.3)  # long enough for both children to be busy
    calls_before = world.dep_calls()
    tripping = [world.publish("charge", f"b-{i}") for i in range(2)]
    wait_for(lambda: breaker.state == "open", "the breaker to open")
    parked_tripping = world.wait_parked(tripping)
    trip_calls = world.dep_log()[calls_before:]
    assert 3 <= len(trip_calls) <= 3 + concurrency - 1  # in-flight permits may still fail
    if concurrency > 1:
        assert len({c["pid"] for c in trip_calls}) == concurrency, trip_calls
    assert {e.reason for e in parked_tripping.values()} == {"breaker_open"}

    calls_open = world.dep_calls()
    later = [world.publish("charge", f"c-{i}") for i in range(3)]
    parked_later = world.wait_parked(later)
    assert {e.reason for e in parked_later.values()} == {"breaker_open"}
    assert {e.retries for e in parked_later.values()} == {0}
    assert world.dep_calls() == calls_open
    snapshot = breaker.snapshot()
    assert snapshot["state"] == "open"
    assert snapshot["opened_total"] == 1
    assert worker.log().count("Breaker 'dep' opened") == 1


def tasks_succeed_once_dependency_is_back(world: World) -> list[str]:
    """(c) Given the dependency back and the breaker reset, new tasks succeed."""
    breaker = world.resilience.breaker("dep")
    world.dependency(up=True)
    breaker.reset()
    recovered = [world.publish("charge", f"d-{i}") for i in range(2)]
    wait_for(lambda: set(recovered) <= world.succeeded(), "the recovered tasks to succeed")
    wait_for(lambda: {world.state(t) for t in recovered} == {"SUCCESS"}, "SUCCESS states")
    assert breaker.snapshot()["opened_total"] == 1  # reset keeps the totals
    return recovered


# -- 2. retries run out ------------------------------------------------------------------------
def test_exhausted_task_is_parked_with_everything_needed_to_replay_it(
    make_world: Callable[..., World],
) -> None:
    world = make_world(failure_threshold=100, max_retries=2, backoff_base=0.1)
    world.start_worker()
    world.dependency(up=False)

    task_id = world.publish("charge", "o-2", amount=42)
    entry = world.wait_parked([task_id])[task_id]

    assert entry.reason == "retries_exhausted"
    assert entry.task_name == "workerapp.charge"
    assert entry.task_id == task_id
    assert entry.args == ["o-2"]
    assert entry.kwargs == {"amount": 42}
    assert entry.exc_type.endswith("ConnectionError")
    assert entry.exc_message == "dependency down (order o-2)"
    assert "call_dependency" in entry.traceback
    assert entry.retries == 2
    assert entry.breaker == "dep"
    assert entry.status == "parked"
    assert world.queue in (entry.options.get("queue"), entry.options.get("routing_key"))
    assert [c["retries"] for c in attempts_by_task(world)[task_id]] == [0, 1, 2]
    # The entry is stored before its PARKED state is written to the result backend.
    wait_for(lambda: world.state(task_id) == "PARKED", "the PARKED state")
    assert world.resilience.breaker("dep").snapshot()["opened_total"] == 0
    world.assert_ledger()


# -- 3. the task's own failure ---------------------------------------------------------------
def test_non_transient_error_fails_the_task_and_leaves_the_breaker_alone(
    make_world: Callable[..., World],
) -> None:
    world = make_world(failure_threshold=3)
    worker = world.start_worker()
    breaker = world.resilience.breaker("dep")

    def dependency_down() -> None:
        raise ConnectionError("down")

    for _ in range(2):  # one failure short of the threshold
        with pytest.raises(ConnectionError):
            breaker.call(dependency_down)
    before = breaker.snapshot()
    assert before["consecutive_failures"] == 2

    crashed = [world.publish("crash", f"x-{i}") for i in range(3)]
    wait_for(lambda: {world.state(t) for t in crashed} == {"FAILURE"}, "FAILURE states")
    result = world.app.AsyncResult(crashed[0])
    assert isinstance(result.result, ValueError)
    assert "does not exist" in str(result.result)
    worker.stop()  # flushes any deferred breaker record: a success would show now

    after = breaker.snapshot()
    for field in ("state", "consecutive_failures", "window_calls", "window_failures"):
        assert after[field] == before[field], field
    assert after["opened_total"] == 0
    world.assert_ledger(failed=set(crashed))


# -- 4. a delay longer than the broker holds safely ------------------------------------------
def test_delay_above_max_countdown_is_parked_with_due_at_not_sent_as_eta(
    make_world: Callable[..., World],
) -> None:
    # "equal" jitter: the first delay is in [5, 10] s, always above the 2 s limit.
    world = make_world(
        failure_threshold=100, max_countdown=2, backoff_base=10, backoff_cap=60, jitter="equal"
    )
    world.start_worker()
    world.dependency(up=False)

    task_id = world.publish("charge", "o-4")
    entry = world.wait_parked([task_id])[task_id]

    assert entry.reason == "delay_too_long"
    assert entry.retries == 0
    assert 5.0 - 0.01 <= entry.due_at - entry.parked_at <= 10.0 + 0.01
    assert entry.due_at > world.now() + 2.0
    assert world.dep_calls() == 1
    time.sleep(0.5)  # a retry published by mistake would reach the broker by now
    assert world.broker_messages_of(task_id) == []  # not in the queue, not in ``unacked``
    assert world.redis.hlen(f"{broker_keyprefix(world.prefix)}unacked") == 0
    # The entry is stored before its PARKED state is written to the result backend.
    wait_for(lambda: world.state(task_id) == "PARKED", "the PARKED state")
    assert world.dep_calls() == 1
    world.assert_ledger()


# -- 5. the same fleet breaker over RabbitMQ ---------------------------------------------------
def test_breaker_opens_and_parks_with_rabbitmq_broker(make_world: Callable[..., World]) -> None:
    require_rabbitmq()
    world = make_world(broker=AMQP_URL, failure_threshold=3, open_timeout=60, backoff_base=0.1)
    worker = world.start_worker()
    breaker = world.resilience.breaker("dep")
    world.dependency(up=False)

    tripping = [world.publish("charge", f"b-{i}") for i in range(2)]
    wait_for(lambda: breaker.state == "open", "the breaker to open")
    world.wait_parked(tripping)
    calls_open = world.dep_calls()
    assert calls_open == 3

    later = [world.publish("charge", f"c-{i}") for i in range(3)]
    parked = world.wait_parked(later)
    assert {e.reason for e in parked.values()} == {"breaker_open"}
    assert world.dep_calls() == calls_open
    assert breaker.snapshot()["opened_total"] == 1
    assert worker.log().count("Breaker 'dep' opened") == 1
    counts = world.assert_ledger()
    assert counts["parked"] == 5


@pytest.fixture
def rabbitmq_vhost() -> Iterator[str]:
    """The URL of a RabbitMQ virtual host of the test's own, deleted with all it holds."""
    require_rabbitmq()
    name = f"resilience-test-{uuid.uuid4().hex[:10]}"
    rabbitmqctl("add_vhost", name)
    try:
        rabbitmqctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
        yield f"{AMQP_URL.rstrip('/')}/{name}"
    finally:
        rabbitmqctl("delete_vhost", name)


def rabbitmqctl(*args: str) -> str:
    command = shutil.which("rabbitmqctl")
    if command is None:
        service_missing("rabbitmqctl is missing (it comes with rabbitmq-server)")
    done = subprocess.run([command, *args], capture_output=True, text=True, timeout=180, check=True)
    return done.stdout


def queue_depths(vhost_url: str) -> dict[str, int]:
    """Messages (ready and unacked) of each queue of the virtual host, as RabbitMQ counts them."""
    vhost = urlparse(vhost_url).path.lstrip("/")
    listed = rabbitmqctl(
        "list_queues", "-p", vhost, "--quiet", "--no-table-headers", "name", "messages"
    )
    return {name: int(count) for name, count in (line.split() for line in listed.splitlines())}


def test_a_retry_past_the_consumer_timeout_waits_in_rabbitmq_where_celery_delays_natively(
    rabbitmq_vhost: str, make_world: Callable[..., World]
) -> None:
    """Quorum queues behind a topic exchange: on Celery 5.5 and later a countdown waits in
    RabbitMQ's delay queues (native delayed delivery), so a retry of two hours is sent as a
    countdown; before, a worker would hold it past RabbitMQ's consumer timeout, so it is parked
    with a due time, as on any broker that can't hold it."""
    world = make_world(
        broker=rabbitmq_vhost,
        quorum=1,
        failure_threshold=100,
        backoff_base=7200,
        backoff_cap=7200,
        jitter="none",
        max_retries=1,
    )
    natively = native_delayed_delivery(world.app.conf)
    assert natively is (celery.VERSION >= (5, 5))
    worker = world.start_worker()
    world.dependency(up=False)

    task_id = world.publish("charge", "q-1")

    if not natively:
        entry = world.wait_parked([task_id])[task_id]
        assert entry.reason == "delay_too_long"
        assert world.dep_calls() == 1
        return
    wait_for(lambda: (task_id, 1) in countdowns_logged(worker.log()), "the retry's countdown")
    assert countdowns_logged(worker.log())[(task_id, 1)] == 7200.0

    # In one of RabbitMQ's delay queues, not in the task's queue nor held by the worker.
    def delayed() -> int:
        depths = queue_depths(rabbitmq_vhost)
        return sum(n for queue, n in depths.items() if queue.startswith("celery_delayed_"))

    wait_for(lambda: delayed() == 1, "the retry in one of RabbitMQ's delay queues")
    assert queue_depths(rabbitmq_vhost)[world.queue] == 0
    assert world.parked() == {}
    assert world.dep_calls() == 1


@pytest.mark.parametrize(
    ("ci", "outcome"), [("1", pytest.fail.Exception), ("", pytest.skip.Exception)]
)
def test_a_missing_rabbitmq_fails_in_ci_and_skips_elsewhere(
    monkeypatch: pytest.MonkeyPatch, ci: str, outcome: type[BaseException]
) -> None:
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match=r"no RabbitMQ at 127\.0\.0\.1"):
        require_rabbitmq(f"amqp://guest:guest@127.0.0.1:{free_port()}//")


# -- 6. kill -9 of a pool child mid-task -------------------------------------------------------
def test_pool_child_killed_mid_task_loses_nothing(make_world: Callable[..., World]) -> None:
    # What brings the killed task back (checked here, kombu/celery 5.7): neither the visibility
    # timeout nor a worker restart. With acks_late + task_reject_on_worker_lost, the parent
    # rejects the message with requeue=True as soon as it notices the dead child (at once
    # through the child's sentinel, or at its maintain_pool tick every 5 s: both were seen),
    # and kombu's Redis QoS.reject restores it from ``unacked`` right then, with LPUSH: to the
    # *back* of the queue (workers BRPOP the other end), so it runs again after the backlog.
    # A visibility-timeout restore (restore_visible) would RPUSH it to the front, and in a
    # running worker that sweep runs only every unacked_restore_interval * throttle (~100 s).
    # The short visibility timeout (5 s) stays as a trap: with one prefetched message per
    # child, no healthy message waits in ``unacked`` long enough to be restored and run twice.
    world = make_world(visibility_timeout=5, prefetch_multiplier=1)
    worker = world.start_worker("prefork", 2)
    started_key = f"{world.prefix}:slow:started"

    published = [world.publish("slow", f"s-{i}", 0.5 + 0.05 * (i % 10)) for i in range(20)]

    def running_victim() -> dict[str, Any] | None:
        """A task that started under 0.2 s ago (so it runs >= 0.3 s more) on a live child."""
        if world.redis.llen(started_key) < 3:
            return None
        now, children = world.now(), worker.children()
        for raw in reversed(world.redis.lrange(started_key, 0, -1)):
            record = json.loads(raw)
            if now - record["time"] < 0.2 and record["pid"] in children:
                return dict(record)
        return None

    victim = wait_for(running_victim, "a task running on a pool child")
    killed_at = time.monotonic()
    worker.kill_child(victim["pid"])
    queue_key = f"{broker_keyprefix(world.prefix)}{world.queue}"
    victim_id = victim["task_id"].encode()

    def requeued_position() -> tuple[int] | None:
        """Index of the victim's message in the queue list (0: LPUSHed, the back of the line)."""
        messages = world.redis.lrange(queue_key, 0, -1)
        found = [i for i, m in enumerate(messages) if victim_id in m]
        return (found[0],) if found else None

    (position,) = wait_for(requeued_position, "the killed task's message back in the queue", 15.0)
    requeued_after = time.monotonic() - killed_at
    print(
        f"killed task back in the queue at index {position}, {requeued_after:.2f}s after the kill"
    )
    assert position == 0  # reject(requeue=True) LPUSHes; a visibility restore would RPUSH
    assert requeued_after < 10.0

    wait_for(
        lambda: set(published) <= world.succeeded() | set(world.parked()),
        "every published task to succeed or park",
    )
    starts = [json.loads(r) for r in world.redis.lrange(started_key, 0, -1)]
    runs = Counter(s["task_id"] for s in starts)
    assert runs[victim["task_id"]] >= 2, "the killed task was not run again"
    assert "WorkerLostError" in worker.log() or "signal 9" in worker.log()
    counts = world.assert_ledger()
    print(f"runs per task: {sorted(Counter(runs.values()).items())} (runs: tasks)")
    assert counts["succeeded"] + counts["parked"] == len(published)


# -- 7. a poison message: parked after max_deliveries crashes, never fed back by the drain -------
def test_a_message_that_kills_its_worker_is_parked_and_held_from_the_drain(
    make_world: Callable[..., World],
) -> None:
    world = make_world(prefetch_multiplier=1)
    worker = world.start_worker("prefork", 1)
    deaths = f"{world.prefix}:poison:deaths"

    task_id = world.publish("poison", "p-1")
    entry = world.wait_parked([task_id], timeout=40.0)[task_id]

    max_deliveries = world.resilience.runtime.config.max_deliveries
    assert (entry.reason, entry.status) == ("redelivered", "parked")
    assert world.redis.llen(deaths) == max_deliveries  # each delivery killed its child
    assert worker.process is not None
    assert worker.process.poll() is None

    # The drain never feeds it back to the pool: only a person replays it.
    report = world.resilience.drain()
    assert (report.replayed, report.skipped) == (0, 0)
    assert world.resilience.backout.get(entry.id) == entry
    time.sleep(0.5)
    assert world.redis.llen(deaths) == max_deliveries
    world.assert_ledger()


# -- 8. the task's own error during a half-open probe ------------------------------------------
def test_a_probe_ending_in_the_tasks_own_error_is_released_not_judged(
    make_world: Callable[..., World],
) -> None:
    world = make_world(failure_threshold=1, open_timeout=0.3)
    world.start_worker()
    breaker = world.resilience.breaker("dep")
    with pytest.raises(ConnectionError):
        breaker.call(lambda: (_ for _ in ()).throw(ConnectionError("down")))
    wait_for(lambda: breaker.state == "half_open", "the breaker to half-open")

    # A parser error on a 503 page says nothing about the dependency: the probe is given back.
    crashed = world.publish("crash", "x-probe")
    wait_for(lambda: world.state(crashed) == "FAILURE", "the crash to fail")
    # Given back at once, not after its 60 s lease (Celery may store the FAILURE first).
    wait_for(lambda: breaker.snapshot()["probes_in_flight"] == 0, "the probe given back", 20.0)
    snap = breaker.snapshot()
    assert (snap["state"], snap["closed_total"]) == ("half_open", 0)

    # The next call probes at once (not after probe_lease) and decides.
    world.dependency(up=True)
    charged = world.publish("charge", "o-probe")
    wait_for(lambda: charged in world.succeeded(), "the probe to succeed")
    assert breaker.state == "closed"
    world.assert_ledger(failed={crashed})


# -- 9. a database store that refuses the park (a real DatabaseError) ---------------------------
def test_a_database_error_at_park_keeps_the_message_until_the_store_takes_it(
    make_world: Callable[..., World], tmp_path: Path
) -> None:
    import sqlite3
    import subprocess
    import sys

    db = tmp_path / "parked.sqlite3"
    world = make_world(keep_delay=0.3)
    env = {**world.env, "DJANGOAPP_DB": str(db)}
    migrate = "import tests.apps.djangoworkerapp as a; a.migrate()"
    subprocess.run([sys.executable, "-c", migrate], env={**os.environ, **env}, check=True)
    table = "celery_resilience_parkedtaskrecord"
    with sqlite3.connect(db) as sql:  # every INSERT now fails: an IntegrityError from Django
        sql.execute(
            f"CREATE TRIGGER no_parks BEFORE INSERT ON {table} "
            "BEGIN SELECT RAISE(ABORT, 'parking is off'); END"
        )
    log = tmp_path / "worker-django.log"
    worker = WorkerProcess(env, log, app="tests.apps.djangoworkerapp")
    world.workers.append(worker)
    worker.start()
    world.resilience.breaker("dep").force_open()

    task_ids = [world.publish("charge", f"d-{i}") for i in range(2)]
    # Several rounds of "park refused, kept in the broker, back again": each a delivery.
    wait_for(
        lambda: all(worker.log().count(f"[{t}] received") >= 3 for t in task_ids),
        "three deliveries of each task",
    )
    with sqlite3.connect(db) as sql:
        assert sql.execute(f"SELECT COUNT(*) FROM {table}").fetchone() == (0,)
    assert all(world.broker_messages_of(t) for t in task_ids)  # waiting in the broker
    assert worker.log().count("Could not park workerapp.charge") == 1  # once per cause
    assert "IntegrityError: parking is off" in worker.log()

    with sqlite3.connect(db) as sql:
        sql.execute("DROP TRIGGER no_parks")

    def parked_rows() -> list[Any] | None:
        with sqlite3.connect(db) as sql:
            rows = sql.execute(f"SELECT task_id, reason FROM {table}").fetchall()
        return rows if len(rows) == 2 else None

    rows = wait_for(parked_rows, "both tasks parked in the database", poll=0.1)
    assert sorted(rows) == sorted((t, "breaker_open") for t in task_ids)
    assert "Parking works again after" in worker.log()


def test_a_breaker_per_host_parks_only_the_dead_hosts_work_and_the_drain_brings_it_back(
    make_world: Callable[..., World],
) -> None:
    """``breaker_key="{host}"`` on a real prefork worker: one host down trips its own breaker
    (``hook:dead.example``), its deliveries park under it, the other hosts' tasks all succeed;
    once the host is back and its breaker half-opens, the drain replays its entries alone."""
    world = make_world(hooks=1, failure_threshold=2, open_timeout=3, max_retries=0)
    world.redis.sadd(f"{world.prefix}:dep:down-hosts", "dead.example")
    world.start_worker(pool="prefork", concurrency=2)
    hosts = ["dead.example", "a.example", "b.example", "c.example"]
    ids = {host: [world.publish("webhook", host, n) for n in range(6)] for host in hosts}
    wait_for(lambda: set(ids["dead.example"]) <= set(world.parked()), "the dead host's parked")
    wait_for(
        lambda: {i for h in hosts[1:] for i in ids[h]} <= world.succeeded(), "the rest succeed"
    )
    parked = world.parked()
    assert {e.breaker for e in parked.values()} == {"hook:dead.example"}
    dead = world.resilience.breaker("hook", key="dead.example").snapshot()
    # Tripped; its 3 s open time may have run out while the other hosts' tasks ran.
    assert dead["opened_total"] >= 1, dead
    assert dead["state"] in ("open", "half_open"), dead
    assert world.resilience.breaker("hook", key="a.example").state == "closed"
    world.assert_ledger()
    world.redis.srem(f"{world.prefix}:dep:down-hosts", "dead.example")
    wait_for(
        lambda: world.resilience.breaker("hook", key="dead.example").state == "half_open",
        "the host's breaker half-opens",
    )

    def drained() -> bool:
        world.resilience.drain_once()
        return set(ids["dead.example"]) <= world.succeeded()

    wait_for(drained, "the drain replays the host's tasks")
    assert world.parked() == {}
    world.assert_ledger()
