"""The claim of a task id (``deduplicate=True``): one contract, for the memory and Redis stores.

A delivery that is admitted claims its task id in the same atomic step as the admission (the
breaker's ``acquire``, or ``deliver`` for a task without a breaker); while the claim lives, every
other delivery of the id is told ``claimed`` and how long the claim may last; the success
marker replaces it; only its holder can give it back; once its lease ends, the next delivery
claims the id. ``tests/test_breaker_stateful.py`` holds the same answers against random histories
for tasks with a breaker; ``tests/test_dedup_worker.py`` shows them in real workers.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery, states

from celery_resilience import Resilience, ResilientTask
from celery_resilience.breaker import MemoryBreakerStore, RedisBreakerStore
from celery_resilience.breaker.store import DeliveryQuestions
from celery_resilience.breaker.types import Limits
from celery_resilience.config import BreakerConfig
from celery_resilience.errors import TaskIdClaimed

from .support.waiting import wait_for

pytestmark = pytest.mark.contract

Store = MemoryBreakerStore | RedisBreakerStore
LEASE_US = 30_000_000
LIMITS = Limits.of(BreakerConfig())


class Clock:
    """The memory store's clock (µs), moved by the test; Redis keeps its own."""

    def __init__(self) -> None:
        self.now = time.time_ns() // 1000

    def __call__(self) -> int:
        return self.now


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    if request.param == "memory":
        yield MemoryBreakerStore(clock=Clock())
        return
    client: redis.Redis = request.getfixturevalue("redis_client")
    yield RedisBreakerStore(client, request.getfixturevalue("key_prefix"))


def delivery(task_id: str, lease_us: int = LEASE_US, claim: bool = True) -> DeliveryQuestions:
    token = uuid.uuid4().hex if claim else ""
    return DeliveryQuestions(
        task_id=task_id, retries=0, check_done=True, claim=token, lease_us=lease_us
    )


def ask(store: Store, scope: str | None, d: DeliveryQuestions) -> tuple[str, float]:
    """(skip, seconds the claim held by another lasts) through the scope's own operation."""
    if scope is None:
        _, skip, wait_us = store.deliver(None, d)
        return skip, wait_us / 1e6
    decision = store.acquire(scope, LIMITS, uuid.uuid4().hex, delivery=d)
    assert decision.allowed == (decision.skip == "")
    return decision.skip, decision.claim_wait_us / 1e6


def expire(store: Store, lease_us: int) -> None:
    """Let a claim's lease run out: the memory clock moves, Redis's runs."""
    if isinstance(store, MemoryBreakerStore):
        assert isinstance(store._clock, Clock)
        store._clock.now += lease_us + 1
    else:
        time.sleep(lease_us / 1e6 + 0.05)


@pytest.mark.parametrize("scope", ["payments", None])
def test_an_admitted_delivery_claims_the_id_until_done_or_given_back(
    store: Store, scope: str | None
) -> None:
    task_id = f"t-{uuid.uuid4().hex[:8]}"
    first, second = delivery(task_id), delivery(task_id)

    # Given a delivery that was admitted: it holds the id's claim
    assert ask(store, scope, first) == ("", 0.0)
    # When another delivery of the id asks, it is told the id is claimed, for about the lease
    skip, wait = ask(store, scope, second)
    assert skip == "claimed"
    assert LEASE_US / 1e6 - 5.0 < wait <= LEASE_US / 1e6
    # Only the holder's token gives the claim back
    assert store.unclaim(scope, task_id, second.claim) is False
    assert ask(store, scope, second)[0] == "claimed"
    assert store.unclaim(scope, task_id, first.claim) is True
    assert store.unclaim(scope, task_id, first.claim) is False
    # Then the next delivery claims it, and its success marker replaces the claim for good
    assert ask(store, scope, second) == ("", 0.0)
    store.mark_done(scope, task_id, 3600)
    assert store.unclaim(scope, task_id, second.claim) is False
    assert ask(store, scope, delivery(task_id))[0] == "done"


def store_now_us(store: Store) -> int:
    if isinstance(store, MemoryBreakerStore):
        return int(store._clock())
    seconds, micros = store.client.time()
    return int(seconds) * 1_000_000 + int(micros)


@pytest.mark.parametrize("scope", ["payments", None])
def test_when_a_claim_ends_is_told_while_it_is_held(store: Store, scope: str | None) -> None:
    task_id = f"t-{uuid.uuid4().hex[:8]}"
    assert store.claim_end(scope, task_id) == 0  # nothing runs it
    holder = delivery(task_id)

    before = store_now_us(store)
    ask(store, scope, holder)
    end = store.claim_end(scope, task_id)

    assert before + LEASE_US <= end <= store_now_us(store) + LEASE_US  # its lease's end
    store.unclaim(scope, task_id, holder.claim)
    assert store.claim_end(scope, task_id) == 0  # given back
    ask(store, scope, delivery(task_id))
    store.mark_done(scope, task_id, 3600)
    assert store.claim_end(scope, task_id) == 0  # succeeded: no claim to wait for


@pytest.mark.parametrize("scope", ["payments", None])
def test_a_claim_whose_lease_ended_is_taken_by_the_next_delivery(
    store: Store, scope: str | None
) -> None:
    # Given a claim whose holder died (it never gave it back) and whose lease then ended
    task_id = f"t-{uuid.uuid4().hex[:8]}"
    lease_us = 1_000_000  # a second: the second ask must come within it on a loaded host
    dead = delivery(task_id, lease_us)
    assert ask(store, scope, dead)[0] == ""
    assert ask(store, scope, delivery(task_id, lease_us))[0] == "claimed"
    expire(store, lease_us)
    # When the next delivery asks, it claims the id; the dead holder's token gives nothing back
    late = delivery(task_id)
    assert ask(store, scope, late) == ("", 0.0)
    assert store.unclaim(scope, task_id, dead.claim) is False
    assert ask(store, scope, delivery(task_id))[0] == "claimed"


@pytest.mark.parametrize("scope", ["payments", None])
def test_a_message_redelivered_past_max_deliveries_is_parked_even_while_its_id_is_claimed(
    store: Store, scope: str | None
) -> None:
    # Given a claim held by a delivery whose worker the message killed (a poison message)
    task_id = f"t-{uuid.uuid4().hex[:8]}"
    assert ask(store, scope, delivery(task_id))[0] == ""
    # When the message comes back again and again (counted: the broker flags redeliveries)
    again = dataclasses.replace(delivery(task_id), count=True, ttl=60, max_deliveries=2)
    # Then it waits for the claim while under the limit, and is parked past it, not held forever
    assert ask(store, scope, again)[0] == "claimed"
    assert ask(store, scope, again)[0] == "redelivered"


@pytest.mark.parametrize("scope", ["payments", None])
def test_many_deliveries_at_once_admit_exactly_one(
    redis_client: redis.Redis, key_prefix: str, scope: str | None
) -> None:
    # Given 8 processes' worth of clients asking for the same new task id at the same moment
    task_id = f"t-{uuid.uuid4().hex[:8]}"
    stores = [
        RedisBreakerStore(redis.Redis.from_url(_url(redis_client)), key_prefix) for _ in range(8)
    ]
    barrier = threading.Barrier(len(stores))
    answers: list[str] = []

    def one(s: RedisBreakerStore) -> None:
        barrier.wait()
        answers.append(ask(s, scope, delivery(task_id))[0])

    threads = [threading.Thread(target=one, args=(s,)) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Then exactly one is admitted; every other is told the id is claimed
    assert sorted(answers) == [""] + ["claimed"] * 7


def _url(client: redis.Redis) -> str:
    kwargs: dict[str, Any] = client.connection_pool.connection_kwargs
    return f"redis://{kwargs['host']}:{kwargs['port']}/{kwargs['db']}"


# -- the task's side, eager ---------------------------------------------------------------------


@pytest.fixture
def app(redis_url: str, key_prefix: str) -> Iterator[Celery]:
    app = Celery("t", broker=redis_url, set_as_current=False)
    app.conf.task_always_eager = True
    app.conf.resilience_key_prefix = key_prefix
    app.conf.resilience_redis_url = redis_url
    yield app
    Resilience.for_app(app).runtime.close()


@pytest.mark.parametrize("breaker", ["dep", None])
def test_a_call_finding_its_id_claimed_elsewhere_does_not_run(
    app: Celery, breaker: str | None
) -> None:
    calls: list[int] = []

    @app.task(base=ResilientTask, bind=True, shared=False, breaker=breaker, deduplicate=True)
    def refund(self: Any, n: int) -> int:
        calls.append(n)
        return n

    # Given a worker's delivery of "refund-1" holding the id's claim
    guard = Resilience.for_app(app).runtime.guard
    holder = delivery("refund-1")
    assert ask(guard, breaker, holder)[0] == ""  # type: ignore[arg-type]

    # When the task id is called meanwhile, the body does not run: the caller is told why
    result = refund.apply((1,), task_id="refund-1")
    assert result.state == states.FAILURE
    assert isinstance(result.result, TaskIdClaimed)
    assert 0 < result.result.retry_after <= LEASE_US / 1e6
    assert calls == []

    # Then once the holder gives the claim back, a call runs
    guard.unclaim(breaker, "refund-1", holder.claim)
    assert refund.apply((1,), task_id="refund-1").state == states.SUCCESS
    assert calls == [1]


def test_claims_use_the_breakers_hash_tag(redis_client: redis.Redis, key_prefix: str) -> None:
    store = RedisBreakerStore(redis_client, key_prefix)
    assert ask(store, "payments", delivery("tagged"))[0] == ""
    assert ask(store, None, delivery("tagged"))[0] == ""
    keys = {k.decode() for k in redis_client.scan_iter(match=f"*{key_prefix}*done:tagged")}
    assert keys == {
        f"{{{key_prefix}:breaker:payments}}:done:tagged",
        f"{{{key_prefix}:tasks}}:done:tagged",
    }
    wait_for(lambda: redis_client.pttl(next(iter(keys))) > 0, "a lease on the key")
