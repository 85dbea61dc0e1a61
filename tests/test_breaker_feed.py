"""What a process knows of its breakers between round trips stays true: the change feed is the
app's own (not another database's), a breaker whose state was deleted and made again is told
apart from the one a process knew, no view is trusted longer than ``MAX_KNOWLEDGE_AGE``, and the
feed's thread outlives whatever is raised in it. Real Redis throughout."""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
import redis
from celery import Celery

from celery_resilience import BreakerOpen, Resilience
from celery_resilience.breaker import Breaker
from celery_resilience.breaker import watch as watch_module
from celery_resilience.breaker.knowledge import MAX_KNOWLEDGE_AGE
from celery_resilience.breaker.watch import RedisWatch
from celery_resilience.contrib.pytest import delete_prefix

pytestmark = pytest.mark.integration

SERVER = "redis://127.0.0.1:6379"
#: Calls a worker would make while it believes the breaker closed: one every 50 ms.
CALL_EVERY = 0.05

MakeBreaker = Callable[..., Breaker]


@pytest.fixture
def make_breaker(key_prefix: str) -> Iterator[MakeBreaker]:
    """A breaker ``dep`` of a fresh app (one "worker process") on database ``db``."""
    made: list[Resilience] = []
    used: set[int] = set()

    def make(db: int = 15) -> Breaker:
        app = Celery("t", broker=f"{SERVER}/{db}", set_as_current=False)
        app.conf.resilience_key_prefix = key_prefix
        app.conf.resilience_redis_url = f"{SERVER}/{db}"
        app.conf.resilience_breakers = {"dep": {"failure_threshold": 3, "open_timeout": 60.0}}
        resilience = Resilience(app)
        made.append(resilience)
        used.add(db)
        return resilience.breaker("dep")

    yield make
    for resilience in made:
        resilience.runtime.close()
    for db in used:  # only this test's keys, in every database it wrote to
        client = redis.Redis.from_url(f"{SERVER}/{db}")
        delete_prefix(client, key_prefix)
        client.close()


def known(breaker: Breaker) -> Breaker:
    """Wait until the process admits on what it knows, without a round trip."""
    deadline = time.monotonic() + 5.0
    while breaker._knowledge.admits(breaker.name) is None:
        assert time.monotonic() < deadline, "the breaker's view was never learnt"
        breaker.acquire().release()
        time.sleep(0.005)
    return breaker


def admitted_calls(breaker: Breaker, seconds: float) -> list[float]:
    """Call through ``breaker`` every ``CALL_EVERY`` for ``seconds``: when each was admitted."""
    admitted: list[float] = []
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        try:
            breaker.call(lambda: None)
            admitted.append(time.monotonic())
        except BreakerOpen:
            pass
        time.sleep(CALL_EVERY)
    return admitted


def test_apps_on_other_databases_never_hear_each_others_breakers(make_breaker: MakeBreaker) -> None:
    """Given two apps on one server, databases 14 and 15, same prefix, same breaker name, and
    the first app's breaker ahead in versions; when the second app's breaker is forced open,
    then its worker stops admitting at once (before its view could have aged out)."""
    worker = known(make_breaker(db=15))
    other_app = make_breaker(db=14)
    for _ in range(5):  # versions 1..10 on database 14
        other_app.force_open()
        other_app.reset()
    time.sleep(0.2)  # what the worker would hear of database 14 has arrived
    make_breaker(db=15).force_open()  # version 1 on database 15, by an operator elsewhere
    forced = time.monotonic()
    admitted = admitted_calls(worker, 5.0)
    late = [t for t in admitted if t - forced > MAX_KNOWLEDGE_AGE / 2]
    assert late == [], f"{len(admitted)} calls admitted in 5 s on a breaker forced open"


def test_a_change_about_other_keys_is_not_adopted(
    make_breaker: MakeBreaker, redis_client: redis.Redis
) -> None:
    """Given a worker that knows a breaker closed; when a change for a breaker of that name
    but of another incarnation is published on its channel (a restored copy of the keys
    elsewhere), then the worker does not adopt it: it asks Redis again."""
    operator = make_breaker()
    operator.force_open()
    operator.reset()  # the breaker's hash exists, with an epoch
    worker = known(make_breaker())
    store = worker._store()
    redis_client.publish(store.channel, "1000|closed|0|not-these-keys|dep")  # type: ignore[attr-defined]
    deadline = time.monotonic() + 2.0
    while worker._knowledge.admits("dep") is not None:  # dropped, not adopted
        assert time.monotonic() < deadline, "the foreign change was never noticed"
        time.sleep(0.005)
    operator.force_open()
    with pytest.raises(BreakerOpen):
        worker.acquire()


def test_a_recreated_breaker_is_not_mistaken_for_the_one_a_worker_knew(
    make_breaker: MakeBreaker, redis_client: redis.Redis, key_prefix: str
) -> None:
    """Given a worker that knows a breaker closed at version 10; when its keys are deleted
    (FLUSHDB, eviction) and an operator forces the new breaker open (version 1), then the
    worker stops admitting at once."""
    worker = make_breaker()
    for _ in range(5):
        worker.force_open()
        worker.reset()
    known(worker)
    redis_client.delete(*worker._store().keys("dep"))  # type: ignore[attr-defined]
    make_breaker().force_open()
    forced = time.monotonic()
    admitted = admitted_calls(worker, 3.0)
    late = [t for t in admitted if t - forced > MAX_KNOWLEDGE_AGE / 2]
    assert late == [], f"{len(admitted)} calls admitted in 3 s on a breaker forced open"


def test_no_view_is_trusted_longer_than_the_staleness_bound(
    make_breaker: MakeBreaker, redis_client: redis.Redis
) -> None:
    """Given a worker that knows a breaker closed at version 2; when the breaker's hash is
    restored, silently, from a backup taken while it was forced open at version 1, then the
    worker admits calls no longer than ``MAX_KNOWLEDGE_AGE`` (plus a round trip's slack)."""
    operator = make_breaker()
    operator.force_open()
    key = operator._store().keys("dep")[0]  # type: ignore[attr-defined]
    backup = redis_client.dump(key)
    operator.reset()
    worker = known(make_breaker())
    redis_client.restore(key, 0, cast(bytes, backup), replace=True)  # publishes nothing
    restored = time.monotonic()
    admitted = admitted_calls(worker, MAX_KNOWLEDGE_AGE + 2.0)
    assert admitted, "the worker admitted nothing: the test proves nothing"
    assert admitted[-1] - restored <= MAX_KNOWLEDGE_AGE + 0.5, (
        f"admitted for {admitted[-1] - restored:.1f}s on a breaker forced open"
    )


class Fatal(BaseException):
    """Something no ``except Exception`` catches (as gevent's ``GreenletExit`` would be)."""


def test_the_feed_outlives_base_exceptions_and_logs_the_outage_once(
    redis_client: redis.Redis,
    key_prefix: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Given a watch in which a BaseException is raised on three attempts in a row, then
    once in its change handler; then the thread subscribes again after each, hears the changes
    after them, and each outage is logged once at ERROR and its end once at WARNING."""
    monkeypatch.setattr(watch_module, "RETRY_DELAY", 0.05)
    caplog.set_level(logging.DEBUG, logger="celery_resilience.watch")
    channel = f"{key_prefix}:feed-{uuid.uuid4().hex[:6]}"
    heard: list[str] = []
    lives = threading.Semaphore(0)
    on_live = [Fatal("one"), Fatal("two"), Fatal("three")]
    on_change = [Fatal("four")]

    class Owner:  # the callbacks are held weakly, as the views' methods are
        def change(self, name: str, *_: Any) -> None:
            if on_change:
                raise on_change.pop(0)
            heard.append(name)

        def live(self) -> None:
            if on_live:
                raise on_live.pop(0)
            lives.release()

        def lost(self) -> None:
            pass

    owner = Owner()
    client = redis.Redis.from_url(f"{SERVER}/15")
    watch = RedisWatch(client, channel, owner.change, owner.live, owner.lost)
    try:
        for change in ("lost", "heard"):
            assert lives.acquire(timeout=10.0), "never live again"
            redis_client.publish(channel, f"1|closed|0|e|{change}")
        deadline = time.monotonic() + 5.0
        while heard != ["heard"]:
            assert time.monotonic() < deadline, heard
            time.sleep(0.01)
        assert watch.is_alive()
    finally:
        watch.close()
        client.close()
    logged = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO]
    assert [level for level, _ in logged] == ["ERROR", "WARNING", "ERROR", "WARNING"], logged
    assert "Breaker change feed lost" in logged[0][1]
    assert "Fatal: one" in logged[0][1]
    assert "after 3 failure(s)" in logged[1][1]
    assert "Fatal: four" in logged[2][1]
    assert "after 1 failure(s)" in logged[3][1]


def test_the_feed_waits_longer_after_each_attempt_that_never_went_live(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Given a Redis that can't be reached; then the feed tries again with a growing delay
    (0.1, 0.2, 0.4, 0.8 s ...), not at a fixed rate."""
    from tests.support.redis_server import free_port

    monkeypatch.setattr(watch_module, "RETRY_DELAY", 0.1)
    client = redis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=1)
    attempts: list[float] = []
    subscribe = client.pubsub

    def counted() -> Any:
        attempts.append(time.monotonic())
        return cast(Any, subscribe)()  # redis-py annotates pubsub in some releases only

    monkeypatch.setattr(client, "pubsub", counted)

    class Owner:
        def nothing(self, *_: Any) -> None:
            pass

    owner = Owner()
    watch = RedisWatch(client, "nowhere", owner.nothing, owner.nothing, owner.nothing)
    try:
        deadline = time.monotonic() + 10.0
        while len(attempts) < 5:
            assert time.monotonic() < deadline, attempts
            time.sleep(0.05)
    finally:
        watch.close()
    gaps = [later - earlier for earlier, later in itertools.pairwise(attempts)]
    # The backoff grows: 0.8 s after 0.1, 0.2, 0.4 (a wait never ends early; a long first gap
    # on a busy host must not count against it); at a fixed rate, about 0.1 s.
    assert gaps[-1] >= 0.75, gaps
