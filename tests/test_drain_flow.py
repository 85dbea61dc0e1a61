"""Beat's drain fills spare capacity only: one pass releases what the replays' queue has room
for, ramps up after the breaker closes, keeps the rate as a ceiling, and never waits.

In the drain's world (``tests/support/drain_world.py``): no worker runs, entries are parked
straight into the store, and what a pass published is read back from the Redis broker (a
test's own queue and key prefix).
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from celery import Celery

from celery_resilience import Resilience
from celery_resilience.drain.gate import (
    BULKHEAD_PATIENCE,
    FOLLOW_UP_BUSY,
    FOLLOW_UP_HELD,
    FOLLOW_UP_MAX,
    FOLLOW_UP_MIN,
)
from celery_resilience.drain.pace import STALE
from celery_resilience.drain.queue_room import queue_depth
from tests.support.drain_world import drain_setup, park, queue_keys, sent, sent_count
from tests.support.resilience import AppSetup, MakeResilience
from tests.support.services import service_missing
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

DRAIN_TASK = "celery_resilience.drain"


@pytest.fixture
def app_setup(queue: str) -> AppSetup:
    return drain_setup(queue)


def fill(client: redis.Redis, key: str, count: int) -> None:
    """``count`` messages already waiting in a queue's list (other tasks' work)."""
    client.lpush(key, *[json.dumps({"other": i}) for i in range(count)])


def replays(client: redis.Redis, name: str) -> list[str]:
    """Task ids of the replays (not the drain's own next pass, nor other work) in queue ``name``."""
    found = []
    for key in queue_keys(client, name):
        for raw in client.lrange(key, 0, -1):
            headers = json.loads(raw).get("headers", {})
            if headers.get("task", DRAIN_TASK) != DRAIN_TASK:
                found.append(headers["id"])
    return found


def drain_passes_sent(client: redis.Redis, name: str) -> int:
    """Next passes of the drain waiting in queue ``name``."""
    return sum(
        json.loads(raw).get("headers", {}).get("task") == DRAIN_TASK
        for key in queue_keys(client, name)
        for raw in client.lrange(key, 0, -1)
    )


@pytest.fixture
def other_queue(redis_client: redis.Redis, queue: str) -> Iterator[str]:
    name = f"{queue}-replays"
    yield name
    redis_client.delete(*queue_keys(redis_client, name), f"_kombu.binding.{name}")


# -- back-pressure -----------------------------------------------------------------------------


def test_a_pass_sends_only_what_the_queue_has_room_for(
    make_resilience: MakeResilience,
    redis_client: redis.Redis,
    queue: str,
) -> None:
    # Given a queue holding 3 messages and 1 more in a priority list, and a depth of 6
    resilience = make_resilience(drain_max_queue_depth=6, drain_slow_start=100)
    park(resilience, 10, queue, breaker=None)
    fill(redis_client, queue, 3)
    fill(redis_client, f"{queue}\x06\x163", 1)

    report = resilience.drain_once()

    # Then 2 replays go (6 - 4), the rest waits parked, and the next pass comes soon: the
    # queue had room, so its workers keep up
    assert report.replayed == 2
    assert len(replays(redis_client, queue)) == 2
    assert resilience.backout.count() == 8
    assert resilience.runtime.backout_store.in_flight() == 0
    assert report.next_in == pytest.approx(FOLLOW_UP_MIN)

    # When the workers took everything, the next pass fills the queue again, no more
    for key in queue_keys(redis_client, queue):
        redis_client.delete(key)
    assert resilience.drain_once().replayed == 6
    assert sent_count(redis_client, queue) == 6


def test_a_full_queue_replays_nothing_and_gives_every_claim_back(
    make_resilience: MakeResilience,
    redis_client: redis.Redis,
    queue: str,
) -> None:
    resilience = make_resilience(drain_max_queue_depth=4)
    park(resilience, 5, queue, breaker=None)
    fill(redis_client, queue, 4)

    report = resilience.drain_once()

    assert (report.replayed, report.skipped) == (0, 5)
    assert replays(redis_client, queue) == []
    assert resilience.runtime.backout_store.due("-") == 5  # due at once for the next pass
    # The workers are behind the last pass: the next one waits longer
    assert report.next_in == pytest.approx(FOLLOW_UP_BUSY)


def test_without_a_depth_limit_the_queue_is_not_asked(
    make_resilience: MakeResilience,
    redis_client: redis.Redis,
    queue: str,
) -> None:
    resilience = make_resilience(drain_max_queue_depth=None, drain_slow_start=100)
    park(resilience, 30, queue, breaker=None)
    fill(redis_client, queue, 50)

    assert resilience.drain_once().replayed == 30


# -- never waiting; the rate as a ceiling ---------------------------------------------------------


def test_the_beat_task_returns_at_once_and_sends_its_next_pass(
    make_resilience: MakeResilience,
    redis_client: redis.Redis,
    queue: str,
) -> None:
    # Given 30 due entries and a rate of 2/s with batches of 10 (the old drain slept ~10 s here)
    resilience = make_resilience(
        drain_rate=2.0, drain_batch=10, drain_slow_start=10, drain_max_queue_depth=None
    )
    park(resilience, 30, queue, breaker=None)
    task = resilience.runtime.app.tasks[DRAIN_TASK]

    started = time.monotonic()
    first = task.apply().get()
    second = task.apply().get()
    elapsed = time.monotonic() - started

    # Then the first pass sends a batch, and neither waits for the bucket: a pass that waited
    # for 10 tokens at 2/s would take 5 s. The second finds only what came back between the
    # two (none, or a token where the host is slow): the rate is a ceiling, not a sleep.
    assert first["replayed"] == 10
    assert second["replayed"] <= 2.0 * elapsed, (second, elapsed)
    assert elapsed < 5.0, elapsed
    assert first["next_in"] == pytest.approx(5.0, abs=0.5)  # 10 tokens at 2/s
    # What the bucket got back meanwhile counts.
    assert 5.0 - elapsed - 0.5 < second["next_in"] <= 5.0, (second, elapsed)
    # and one next pass is on its way, not one per run
    assert drain_passes_sent(redis_client, queue) == 1
    assert resilience.backout.count() == 20


def test_the_rate_is_a_ceiling_across_passes(
    make_resilience: MakeResilience,
    redis_client: redis.Redis,
    queue: str,
) -> None:
    resilience = make_resilience(
        drain_rate=20.0, drain_batch=10, drain_slow_start=10, drain_max_queue_depth=None
    )
    park(resilience, 200, queue, breaker=None)

    started = time.monotonic()
    sent_ = 0
    # Passes until the rate has added a batch to the first (about half a second; a busy host's
    # slower passes only take longer, and the ceiling is read against the time they took).
    while sent_ < 20 and time.monotonic() - started < 10.0:
        sent_ += resilience.drain_once().replayed
        # A full bucket (one batch) plus what 20/s adds while the passes ran
        assert sent_ <= 10 + 20.0 * (time.monotonic() - started) + 1
    assert sent_ >= 20


def test_nothing_due_leaves_the_next_pass_to_beat(
    make_resilience: MakeResilience,
    queue: str,
) -> None:
    resilience = make_resilience(drain_slow_start=10)
    park(resilience, 3, queue, breaker=None)

    report = resilience.drain_once()

    assert (report.replayed, report.next_in) == (3, None)


# -- the slow start --------------------------------------------------------------------------


def trip_and_close(resilience: Resilience) -> None:
    breaker = resilience.breaker("dep")
    breaker.acquire().failure()
    assert breaker.state == "open"
    wait_for(lambda: breaker.state == "half_open", "the breaker half-open")
    breaker.acquire().success()  # the probe: the dependency is back
    assert breaker.state == "closed"  # type: ignore[comparison-overlap]  # it changed


def test_after_a_close_the_drain_starts_small_and_doubles_up_to_the_batch(
    make_resilience: MakeResilience,
    queue: str,
) -> None:
    resilience = make_resilience(
        drain_batch=16,
        drain_slow_start=2,
        drain_max_queue_depth=None,
        breakers={"dep": {"failure_threshold": 1, "open_timeout": 0.2}},
    )
    park(resilience, 200, queue)
    trip_and_close(resilience)

    ramp = [resilience.drain_once().replayed for _ in range(5)]
    assert ramp == [2, 4, 8, 16, 16]

    # A new trip starts the ramp over
    trip_and_close(resilience)
    assert [resilience.drain_once().replayed for _ in range(2)] == [2, 4]


def test_a_window_the_queue_cut_short_does_not_grow(
    make_resilience: MakeResilience,
    redis_client: redis.Redis,
    queue: str,
) -> None:
    resilience = make_resilience(drain_batch=16, drain_slow_start=4, drain_max_queue_depth=6)
    park(resilience, 50, queue)
    fill(redis_client, queue, 3)

    assert resilience.drain_once().replayed == 3  # a window of 4, room for 3
    for key in queue_keys(redis_client, queue):
        redis_client.delete(key)
    assert resilience.drain_once().replayed == 4  # room for 6, the window still 4
    assert resilience.drain_once().replayed == 2  # room for 2 (4 waiting), the window now 8


def test_a_half_open_pass_sends_its_probes_only_and_looks_again_soon(
    make_resilience: MakeResilience,
    redis_client: redis.Redis,
    queue: str,
) -> None:
    resilience = make_resilience(
        drain_slow_start=100,
        breakers={"dep": {"failure_threshold": 1, "open_timeout": 0.2, "half_open_max_calls": 2}},
    )
    breaker = resilience.breaker("dep")
    breaker.acquire().failure()
    park(resilience, 10, queue)
    wait_for(lambda: breaker.state == "half_open", "the breaker half-open")

    report = resilience.drain_once()

    # The probes decide; the next pass comes shortly after, not at beat's next tick, so the
    # rest goes out soon after the probes close the breaker
    assert (report.replayed, report.skipped, report.next_in) == (2, 8, FOLLOW_UP_HELD)
    assert len(sent(redis_client, queue)) == 2
    # and it sends no more probes in this half-open, even before a worker took the first ones
    again = resilience.drain_once()
    assert (again.replayed, again.next_in) == (0, FOLLOW_UP_HELD)
    assert len(sent(redis_client, queue)) == 2
    # A new trip's half-open gets its own round
    breaker.acquire().failure()  # the breaker has no probe out of its own: a failure reopens it
    wait_for(lambda: breaker.state == "half_open", "the breaker half-open")
    assert resilience.drain_once().replayed == 2


@pytest.mark.parametrize(("open_timeout", "expected"), [(4.0, (3.0, 4.0)), (60.0, None)])
def test_an_open_breakers_next_pass_comes_when_it_half_opens(
    make_resilience: MakeResilience,
    redis_client: redis.Redis,
    queue: str,
    open_timeout: float,
    expected: tuple[float, float] | None,
) -> None:
    resilience = make_resilience(
        breakers={"dep": {"failure_threshold": 1, "open_timeout": open_timeout}}
    )
    breaker = resilience.breaker("dep")
    breaker.acquire().failure()
    park(resilience, 5, queue)

    report = resilience.drain_once()

    assert (report.replayed, report.skipped) == (0, 5)
    assert sent(redis_client, queue) == []
    assert report.next_in is not None
    if expected is None:  # open for longer: a look every FOLLOW_UP_MAX seconds
        assert report.next_in == FOLLOW_UP_MAX
    else:  # when open_until comes, by Redis's clock
        assert expected[0] < report.next_in <= expected[1]


def test_the_next_pass_is_the_soonest_any_breaker_asks_for(
    make_resilience: MakeResilience,
    queue: str,
) -> None:
    resilience = make_resilience(
        breakers={
            "dep": {"failure_threshold": 1, "open_timeout": 60.0},
            "other": {"failure_threshold": 1, "open_timeout": 3.0},
        }
    )
    for name in ("dep", "other"):
        resilience.breaker(name).acquire().failure()
        park(resilience, 2, queue, breaker=name, tag=name)

    report = resilience.drain_once()

    assert report.next_in is not None
    assert 2.0 < report.next_in <= 3.0


def test_a_breaker_held_open_by_a_person_leaves_the_next_pass_to_beat(
    make_resilience: MakeResilience,
    queue: str,
) -> None:
    resilience = make_resilience()
    resilience.breaker("dep").force_open()
    park(resilience, 5, queue)

    report = resilience.drain_once()

    assert (report.replayed, report.skipped, report.next_in) == (0, 5, None)


def test_a_bulkhead_that_stays_full_holds_replays_back_and_a_moments_one_does_not(
    make_resilience: MakeResilience,
    redis_client: redis.Redis,
    queue: str,
) -> None:
    resilience = make_resilience(
        drain_slow_start=2,
        drain_max_queue_depth=None,
        breakers={"dep": {"max_concurrent_calls": 1}},
    )
    breaker = resilience.breaker("dep")
    permit = breaker.acquire()  # the one call in flight
    park(resilience, 20, queue)

    # A bulkhead full at one moment is a busy recovery: the pass sends (what finds it full
    # waits in the broker)
    first = resilience.drain_once()
    # Full for longer than BULKHEAD_PATIENCE: the dependency hangs, the passes hold
    time.sleep(BULKHEAD_PATIENCE + 0.1)
    held = resilience.drain_once()
    # A free slot ends it
    permit.success()
    freed = resilience.drain_once()

    assert first.replayed == 2
    assert (held.replayed, held.next_in) == (0, FOLLOW_UP_HELD)
    assert freed.replayed == 4  # the slow start's window, doubled by the first pass
    assert len(sent(redis_client, queue)) == 6
    # and a slot seen free forgets when the bulkhead was full: full again, the pass sends
    again = breaker.acquire()
    assert resilience.drain_once().replayed == 8
    # So does a sighting too old to say it stayed full (no pass looked meanwhile)
    again.success()
    time.sleep(STALE + 0.1)
    breaker.acquire()
    assert resilience.drain_once().replayed == 6  # the rest


# -- a queue of their own ------------------------------------------------------------------------


def test_replays_go_to_the_replay_queue_and_its_depth_is_the_one_measured(
    make_resilience: MakeResilience,
    redis_client: redis.Redis,
    queue: str,
    other_queue: str,
) -> None:
    resilience = make_resilience(
        replay_queue=other_queue, drain_max_queue_depth=5, drain_slow_start=100
    )
    options = {"queue": queue, "exchange": "", "routing_key": queue}
    entries = park(resilience, 8, queue, breaker=None, options=options)
    fill(redis_client, queue, 20)  # the app's own queue is busy: not the replays' concern

    report = resilience.drain_once()

    assert report.replayed == 5
    assert len(replays(redis_client, other_queue)) == 5
    assert replays(redis_client, queue) == []
    # A replay by hand goes there too
    left = {e.id for e in resilience.backout.list()}
    resilience.backout.replay(next(e.id for e in entries if e.id in left))
    assert len(replays(redis_client, other_queue)) == 6


# -- the depth, as each broker counts it -------------------------------------------------------


def test_the_depth_of_a_queue_under_kombus_global_key_prefix_is_counted(
    redis_url: str,
    key_prefix: str,
    redis_client: redis.Redis,
    queue: str,
) -> None:
    # Given a Redis broker whose keys live under a global prefix, and 3 messages (1 of them in a
    # priority list) waiting in the queue
    app = Celery("prefixed", broker=redis_url, set_as_current=False)
    app.conf.broker_transport_options = {"global_keyprefix": f"{key_prefix}:broker:"}
    app.conf.resilience_key_prefix = key_prefix
    app.conf.resilience_drain_max_queue_depth = 5
    app.conf.resilience_drain_slow_start = 100
    for priority in (None, None, 9):
        app.send_task("t.other", queue=queue, priority=priority)
    assert redis_client.llen(f"{key_prefix}:broker:{queue}") == 2
    resilience = Resilience.install(app, Resilience(app))
    try:
        assert queue_depth(app, queue) == 3
        assert queue_depth(app, f"{queue}-never-used") == 0
        park(resilience, 10, queue, breaker=None)

        # Then a pass fills the queue up to 5, no more
        assert resilience.drain_once().replayed == 2
        assert queue_depth(app, queue) == 5
    finally:
        resilience.runtime.close()
        app.close()


def amqp_or_skip() -> None:
    try:
        with socket.create_connection(("127.0.0.1", 5672), timeout=1):
            return
    except OSError:
        service_missing("no RabbitMQ on 127.0.0.1:5672")


def test_the_depth_of_a_rabbitmq_queue_is_its_passive_declare_count() -> None:
    amqp_or_skip()
    app = Celery("amqp", broker="amqp://guest:guest@127.0.0.1:5672//", set_as_current=False)
    name = f"drain-depth-{uuid.uuid4().hex[:8]}"
    try:
        assert queue_depth(app, name) == 0  # not declared yet: no queue, no messages
        for _ in range(3):
            app.send_task("t.other", queue=name)
        wait_for(lambda: queue_depth(app, name) == 3, "three messages in the queue")
        assert queue_depth(app, name) == 3  # and the connection is still usable after a miss
    finally:
        with app.connection_for_write() as connection:
            connection.default_channel.queue_delete(name)
        app.close()
