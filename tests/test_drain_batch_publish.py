"""A batch publish that fails part-way is published again only where it did not go out.

A real broker (a ``redis-server`` of the test's own) behind a TCP proxy
(``tests/support/faults.py``): the proxy lets the batch's pipeline reach the broker and swallows
its reply, or holds it and drops the connection before the broker saw it; an ACL refuses one
queue of a batch. No deduplication anywhere: each replay is counted in the broker's lists, per
task id, and must be there exactly once.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

try:
    from kombu.exceptions import BatchPublishError
except ImportError:  # kombu < 5.7: no batch publish, the drain publishes one by one
    pytest.skip("kombu < 5.7 has no batch publish", allow_module_level=True)

from celery_resilience import ParkedTask, Resilience
from celery_resilience.drain.sending import BrokerErrors

from .support.faults import FaultProxy, acl_denied, make_user
from .support.redis_server import RedisServer
from .support.waiting import wait_for

pytestmark = pytest.mark.integration

TASK = "t.batch_charge"


def charge(order: int) -> int:
    return order


@pytest.fixture(scope="module")
def broker() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def proxy(broker: RedisServer) -> Iterator[FaultProxy]:
    fault = FaultProxy(broker.port)
    yield fault
    fault.close()


@pytest.fixture
def make_app(redis_url: str, key_prefix: str) -> Iterator[Any]:
    apps: list[tuple[Celery, Resilience]] = []

    def make(broker_url: str) -> Resilience:
        app = Celery("batch", broker=broker_url, set_as_current=False)
        app.conf.resilience_redis_url = redis_url
        app.conf.resilience_key_prefix = key_prefix
        app.conf.resilience_drain_rate = 100_000.0
        app.conf.resilience_drain_max_queue_depth = None
        app.task(name=TASK, shared=False)(charge)
        resilience = Resilience.install(app, Resilience(app))
        apps.append((app, resilience))
        return resilience

    yield make
    for app, resilience in apps:
        resilience.runtime.close()
        app.close()


def park(resilience: Resilience, count: int, queue: str, tag: str) -> list[str]:
    now = time.time()
    ids = []
    for i in range(count):
        task_id = f"{tag}-{i}-{uuid.uuid4().hex[:8]}"
        resilience.runtime.backout_store.park(
            ParkedTask.new(
                task_name=TASK,
                task_id=task_id,
                reason="breaker_open",
                breaker=None,
                args=[i],
                options={"queue": queue},
                parked_at=now - 60 + i * 1e-3,
                due_at=now - 60 + i * 1e-3,
            )
        )
        ids.append(task_id)
    return ids


def published(client: redis.Redis, *queues: str) -> Counter[str]:
    """How often each task id is in the broker's lists of ``queues``."""
    return Counter(
        json.loads(raw)["headers"]["id"] for queue in queues for raw in client.lrange(queue, 0, -1)
    )


def assert_batches(resilience: Resilience) -> None:
    with resilience.runtime.app.producer_or_acquire() as producer:
        assert producer.supports_batch_publish, "kombu's batch publish is what is tested here"


def drain_until_empty(resilience: Resilience) -> None:
    """Drain until nothing is parked (a given-back batch is due again a few seconds later)."""

    def empty() -> bool:
        resilience.drain()
        return resilience.backout.count() == 0

    wait_for(empty, "every entry published", 30)


def test_a_batch_whose_reply_was_lost_is_not_published_again(
    broker: RedisServer, proxy: FaultProxy, make_app: Any
) -> None:
    # Given a batch small enough to reach the broker in one write, and a proxy that passes it
    # on but loses the reply
    resilience = make_app(f"redis://{proxy.url}/0")
    assert_batches(resilience)
    queue = f"q-{uuid.uuid4().hex[:8]}"
    ids = park(resilience, 4, queue, "lost-reply")
    cut = proxy.cut_reply_on(b"LPUSH")

    report = resilience.drain()

    # Then the batch ran, the drain knows it, and nothing was sent again
    assert cut.is_set()
    assert (report.replayed, report.dead) == (4, 0)
    assert published(broker.client(), queue) == Counter(dict.fromkeys(ids, 1))
    assert resilience.backout.count() == 0


def test_wherever_the_batch_is_cut_each_replay_is_published_once(
    broker: RedisServer, proxy: FaultProxy, make_app: Any
) -> None:
    # Given a batch written in several pieces, and its connection cut once the broker answers
    # the piece that holds its last message: some of it may have run, or none, or all of it
    resilience = make_app(f"redis://{proxy.url}/0")
    queue = f"q-{uuid.uuid4().hex[:8]}"
    ids = park(resilience, 30, queue, "cut")
    cut = proxy.cut_reply_on(ids[-1].encode())

    drain_until_empty(resilience)

    assert cut.is_set()
    assert published(broker.client(), queue) == Counter(dict.fromkeys(ids, 1))


def test_a_batch_the_broker_never_saw_is_given_back_and_published_once(
    broker: RedisServer, proxy: FaultProxy, make_app: Any
) -> None:
    # Given a proxy that holds the batch, then drops every connection before passing it on
    resilience = make_app(f"redis://{proxy.url}/0")
    assert_batches(resilience)
    queue = f"q-{uuid.uuid4().hex[:8]}"
    ids = park(resilience, 10, queue, "never-seen")
    held = proxy.hold_on(b"LPUSH")
    reports: list[Any] = []
    drain = threading.Thread(target=lambda: reports.append(resilience.drain()))
    drain.start()
    assert held.wait(10)
    proxy.reset()
    drain.join(30)

    # Then nothing went out and nothing is lost: the batch is given back, dead for nothing
    (report,) = reports
    assert (report.replayed, report.dead) == (0, 0)
    assert published(broker.client(), queue) == Counter()
    assert resilience.backout.count() == 10

    # and a later drain publishes each once
    drain_until_empty(resilience)
    assert published(broker.client(), queue) == Counter(dict.fromkeys(ids, 1))


def test_a_queue_the_broker_refuses_costs_no_duplicate_of_the_rest_of_its_batch(
    broker: RedisServer, make_app: Any
) -> None:
    # Given a user that may not write one of the two queues of a batch (an ACL)
    admin = broker.client()
    user, password = f"drainer{uuid.uuid4().hex[:6]}", "secret"
    make_user(admin, user, password)
    resilience = make_app(f"redis://{user}:{password}@127.0.0.1:{broker.port}/0")
    assert_batches(resilience)
    good, bad = f"good-{uuid.uuid4().hex[:8]}", f"bad-{uuid.uuid4().hex[:8]}"
    ids = park(resilience, 5, good, "good")
    (refused,) = park(resilience, 1, bad, "bad")
    # It may read the refused queue (kombu declares it by reading): the write, in the batch, fails
    prefix = resilience.runtime.config.key_prefix
    allowed = ["resetkeys", f"~{good}*", f"%R~{bad}*", f"~{prefix}*", "~_kombu*"]

    with acl_denied(admin, user, allowed):
        report = resilience.drain()

    # Then the writable queue holds each of its replays once, the refused one is dead
    assert published(admin, good, bad) == Counter(dict.fromkeys(ids, 1))
    assert (report.replayed, report.dead) == (5, 1)
    (dead,) = resilience.backout.list(status="dead")
    assert dead.task_id == refused
    assert (dead.dead_reason or "").startswith("unpublishable")


def test_a_failed_batch_is_an_outage_or_a_refusal_by_its_cause_never_the_entrys() -> None:
    app = Celery("classify", broker="redis://127.0.0.1:6379/15", set_as_current=False)
    errors = BrokerErrors(app)

    def batch_error(cause: BaseException) -> BatchPublishError:
        try:
            raise BatchPublishError("Redis publish batch failed; delivery is uncertain") from cause
        except BatchPublishError as exc:
            return exc

    lost = errors.classify(batch_error(redis.ConnectionError("connection reset")))
    refused = errors.classify(batch_error(redis.ResponseError("NOPERM no permissions")))
    bare = errors.classify(BatchPublishError("uncertain"))

    assert (lost.kind, refused.kind, bare.kind) == ("outage", "refused", "outage")
    app.close()
