"""The store of the drain's pace, on real Redis: one hash beside the drain lock, read once and
written once per pass, fields the rules forgot deleted."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from celery import Celery

from celery_resilience import Resilience
from celery_resilience.drain.pace import BreakerPace, PaceState
from celery_resilience.drain.pace_store import PaceStore, pace_key

pytestmark = pytest.mark.integration

URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
def app() -> Iterator[Celery]:
    prefix = f"test-pace-{uuid.uuid4().hex[:8]}"
    app = Celery("pace", broker=URL, set_as_current=False)
    app.conf.resilience_redis_url = URL
    app.conf.resilience_key_prefix = prefix
    yield app
    client = redis.Redis.from_url(URL)
    client.delete(pace_key(prefix))
    Resilience.for_app(app).runtime.close()


def test_the_store_keeps_the_state_in_one_hash_and_deletes_what_the_rules_forgot(
    app: Celery,
) -> None:
    runtime = Resilience.for_app(app).runtime
    store = PaceStore(runtime)
    assert store.load() is None
    state = PaceState(5.0, 100.0, {"a": BreakerPace("1", 4), "b": BreakerPace(held_until=130.0)})
    store.save(state)
    again = PaceStore(runtime)
    assert again.load() == state
    again.save(PaceState(6.0, 101.0, {"a": BreakerPace("1", 8)}))
    client = redis.Redis.from_url(URL, decode_responses=True)
    key = pace_key(runtime.config.key_prefix)
    assert client.hgetall(key) == {"tokens": "6.0", "at": "101.0", "trips|a": "1", "window|a": "8"}
    assert 0 < client.ttl(key) <= 86400
