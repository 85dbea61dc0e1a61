"""A dedup key from a task's arguments (``deduplicate="order:{order_id}"`` or a callable): the
claim and the success marker are the key's, so two task ids with one key run the body once.

The store's answers for a key, in memory and in Redis (the same rules as a task id's claim in
``tests/test_dedup_claims.py``); a template checked against the body at registration; eager
calls through a real Redis. ``tests/test_dedup_worker.py`` shows it in real workers.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery, states

from celery_resilience import ConfigurationError, Resilience, ResilientTask
from celery_resilience.breaker import MemoryBreakerStore, RedisBreakerStore
from celery_resilience.breaker.store import DeliveryQuestions
from celery_resilience.breaker.types import Limits
from celery_resilience.config import BreakerConfig
from celery_resilience.errors import TaskIdClaimed

pytestmark = pytest.mark.contract

Store = MemoryBreakerStore | RedisBreakerStore
LEASE_US = 30_000_000
LIMITS = Limits.of(BreakerConfig())


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    if request.param == "memory":
        yield MemoryBreakerStore(clock=lambda: time.time_ns() // 1000)
        return
    client: redis.Redis = request.getfixturevalue("redis_client")
    yield RedisBreakerStore(client, request.getfixturevalue("key_prefix"))


def delivery(task_id: str, key: str = "") -> DeliveryQuestions:
    return DeliveryQuestions(
        task_id=task_id,
        retries=0,
        check_done=True,
        claim=uuid.uuid4().hex,
        lease_us=LEASE_US,
        key=key,
    )


def ask(store: Store, scope: str | None, d: DeliveryQuestions) -> str:
    """The skip answered through the scope's own operation (``""``: admitted, and claimed)."""
    if scope is None:
        return store.deliver(None, d)[1]
    return store.acquire(scope, LIMITS, uuid.uuid4().hex, delivery=d).skip


@pytest.mark.parametrize("scope", ["dep", None])
def test_two_task_ids_with_one_key_are_admitted_one_at_a_time_and_skipped_after_a_success(
    store: Store, scope: str | None
) -> None:
    key = "shop.charge:order:1"
    first, second = delivery("a", key), delivery("b", key)

    # Given a delivery of task id "a" admitted with the key: it holds the key's claim
    assert ask(store, scope, first) == ""
    # Then a delivery of task id "b" with the key is held off, told how long the claim lasts
    assert ask(store, scope, second) == "claimed"
    assert store.claim_end(scope, "b", key) > 0
    assert store.done_by(scope, key) is None
    # And other keys, and the task ids' own markers, are free
    assert ask(store, scope, delivery("c", "shop.charge:order:2")) == ""
    assert ask(store, scope, delivery("b")) == ""

    # When "a" succeeds, "b" is skipped as done, and the key says it succeeded as "a"
    store.mark_done(scope, "a", 3600, key)
    assert ask(store, scope, second) == "done"
    assert store.done_by(scope, key) == "a"
    assert store.claim_end(scope, "b", key) == 0


@pytest.mark.parametrize("scope", ["dep", None])
def test_a_key_given_back_lets_the_next_task_id_run(store: Store, scope: str | None) -> None:
    key = "shop.charge:order:1"
    first, second = delivery("a", key), delivery("b", key)
    assert ask(store, scope, first) == ""

    # When "a" did not succeed: only its holder's token gives the key back
    assert store.unclaim(scope, "a", second.claim, key) is False
    assert store.unclaim(scope, "a", first.claim, key) is True

    # Then "b" is admitted and claims the key
    assert ask(store, scope, second) == ""
    assert ask(store, scope, delivery("c", key)) == "claimed"


def test_a_keys_marker_never_meets_a_task_ids(store: Store) -> None:
    # Given a task id spelled like a key's marker, claimed by a delivery without a key
    assert ask(store, "dep", delivery("dedup:t:order:1")) == ""
    assert ask(store, "dep", delivery("t:order:1")) == ""
    # Then the key "t:order:1" is free all the same
    assert ask(store, "dep", delivery("x", "t:order:1")) == ""


def test_a_keys_claim_uses_the_breakers_hash_tag(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    store = RedisBreakerStore(redis_client, key_prefix)
    assert ask(store, "payments", delivery("a", "shop.charge:order:7")) == ""
    keys = {k.decode() for k in redis_client.scan_iter(match=f"*{key_prefix}*order:7")}
    assert keys == {f"{{{key_prefix}:breaker:payments}}:dedup:shop.charge:order:7"}


# -- the option at registration ---------------------------------------------------------------
@pytest.fixture
def app(redis_url: str, key_prefix: str) -> Iterator[Celery]:
    app = Celery("t", broker=redis_url, set_as_current=False)
    app.conf.task_always_eager = True
    app.conf.resilience_key_prefix = key_prefix
    app.conf.resilience_redis_url = redis_url
    yield app
    Resilience.for_app(app).runtime.close()


@pytest.mark.parametrize(
    ("option", "says"),
    [
        ("order:{order}", "'order' is not one"),
        ("order:{0}", "not positions"),
        ("order:{}", "not positions"),
        ("order", "naming an argument"),
        ("order:{order_id", "str.format template"),
        (3, "True, a template"),
    ],
)
def test_a_template_that_does_not_fit_the_body_fails_at_registration_naming_task_and_option(
    app: Celery, option: Any, says: str
) -> None:
    app.finalize()  # a worker's app: @app.task builds the task at once
    with pytest.raises(ConfigurationError, match=r"shop\.charge\.deduplicate must be") as raised:

        @app.task(base=ResilientTask, name="shop.charge", shared=False, deduplicate=option)
        def charge(order_id: str, amount: int = 0) -> None: ...

    assert says in str(raised.value)
    assert "shop.charge" not in app.tasks


def test_a_bad_template_on_an_app_not_yet_finalized_fails_when_the_worker_finalizes_it(
    app: Celery,
) -> None:
    @app.task(base=ResilientTask, name="shop.charge", shared=False, deduplicate="{order}")
    def charge(order_id: str) -> None: ...

    with pytest.raises(ConfigurationError, match=r"shop\.charge\.deduplicate must be"):
        app.finalize()


def test_templates_over_named_fields_bound_arguments_and_keyword_bodies_register(
    app: Celery,
) -> None:
    options = {"base": ResilientTask, "shared": False}

    @app.task(name="t.fields", bind=True, deduplicate="{order_id}:{customer.id}", **options)
    def fields(self: Any, order_id: str, customer: Any) -> None: ...

    @app.task(name="t.anything", deduplicate="{order_id}", **options)
    def anything(**kwargs: Any) -> None: ...

    @app.task(name="t.callable", deduplicate=lambda order_id: order_id, **options)
    def by_callable(order_id: str) -> None: ...


# -- eager calls through a real Redis --------------------------------------------------------
@pytest.mark.parametrize("breaker", ["dep", None])
@pytest.mark.parametrize("option", ["order:{order_id}", "callable"])
def test_two_task_ids_for_one_order_run_the_body_once(
    app: Celery, breaker: str | None, option: str
) -> None:
    calls: list[tuple[str, str]] = []
    key: Any = (lambda order_id, amount=0: f"order:{order_id}") if option == "callable" else option

    @app.task(base=ResilientTask, bind=True, shared=False, breaker=breaker, deduplicate=key)
    def charge(self: Any, order_id: str, amount: int = 0) -> str:
        calls.append((self.request.id, order_id))
        return order_id

    # Given task id "a" for order o-1 succeeded
    assert charge.apply(("o-1",), task_id="a").state == states.SUCCESS

    # When task ids "b" (o-1 by keyword, another amount) and "c" (o-2) are called
    duplicate = charge.apply(kwargs={"order_id": "o-1", "amount": 5}, task_id="b")
    other = charge.apply(("o-2",), task_id="c")

    # Then "b" was skipped, not run (Celery's eager result of an Ignore); "c" ran
    assert duplicate.state == states.IGNORED
    assert other.state == states.SUCCESS
    assert calls == [("a", "o-1"), ("c", "o-2")]
    # And a redelivery of "a" itself is skipped as a task id that succeeded
    assert charge.apply(("o-1",), task_id="a").state == states.IGNORED
    assert len(calls) == 2


def test_a_call_finding_its_key_held_by_another_task_id_does_not_run(app: Celery) -> None:
    calls: list[str] = []

    @app.task(base=ResilientTask, shared=False, name="shop.refund", deduplicate="{order_id}")
    def refund(order_id: str) -> str:
        calls.append(order_id)
        return order_id

    # Given a worker's delivery of task id "w" holding the key of order o-1
    guard = Resilience.for_app(app).runtime.guard
    holder = delivery("w", "shop.refund:o-1")
    assert ask(guard, None, holder) == ""  # type: ignore[arg-type]

    # When another task id for o-1 is called, it does not run: the caller is told why
    result = refund.apply(("o-1",), task_id="x")
    assert result.state == states.FAILURE
    assert isinstance(result.result, TaskIdClaimed)
    assert result.result.key == "shop.refund:o-1"
    assert "dedup key 'shop.refund:o-1'" in str(result.result)
    assert calls == []

    # Then once the holder gives the key back (its body failed), the other task id runs
    guard.unclaim(None, "w", holder.claim, "shop.refund:o-1")
    assert refund.apply(("o-1",), task_id="x").state == states.SUCCESS
    assert calls == ["o-1"]


def test_a_key_that_cannot_be_rendered_deduplicates_by_task_id_with_an_error_line(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []

    def broken(order_id: str) -> str:
        raise LookupError("no such order")

    @app.task(base=ResilientTask, shared=False, name="shop.ship", deduplicate=broken)
    def ship(order_id: str) -> str:
        calls.append(order_id)
        return order_id

    assert ship.apply(("o-1",), task_id="s-1").state == states.SUCCESS
    assert ship.apply(("o-1",), task_id="s-2").state == states.SUCCESS  # another id: runs
    assert ship.apply(("o-1",), task_id="s-1").state == states.IGNORED  # the id: done
    assert calls == ["o-1", "o-1"]
    assert "Could not render the dedup key of shop.ship[s-1]" in caplog.text


@pytest.mark.parametrize("scope", ["dep", None])
def test_a_task_id_that_succeeded_before_it_had_a_key_is_still_done_with_one(
    store: Store, scope: str | None
) -> None:
    # Given task id "a" succeeded under deduplicate=True (its own marker, done:a)
    store.mark_done(scope, "a", 3600)

    # When the task has a dedup key since, a redelivery or replay of "a" is skipped as done
    assert ask(store, scope, delivery("a", "shop.charge:order:1")) == "done"
    # And the key is still free for another task id
    assert ask(store, scope, delivery("b", "shop.charge:order:1")) == ""


def test_a_template_is_rendered_with_the_bodys_defaults_and_keyword_arguments(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []
    options = {"base": ResilientTask, "shared": False}

    @app.task(name="shop.pay", deduplicate="order:{order_id}:{currency}", **options)
    def pay(order_id: str, currency: str = "EUR") -> None:
        calls.append(f"{order_id} {currency}")

    @app.task(name="shop.note", deduplicate="order:{order_id}", **options)
    def note(**kwargs: Any) -> None:
        calls.append(f"note {kwargs['order_id']}")

    # A default fills its field: the currency left out is the one given
    assert pay.apply(("o-1",), task_id="a").state == states.SUCCESS
    assert pay.apply(("o-1", "EUR"), task_id="b").state == states.IGNORED
    assert pay.apply(("o-1", "USD"), task_id="c").state == states.SUCCESS
    # A body taking **kwargs renders from the keyword arguments
    assert note.apply(kwargs={"order_id": "o-1"}, task_id="d").state == states.SUCCESS
    assert note.apply(kwargs={"order_id": "o-1", "x": 1}, task_id="e").state == states.IGNORED

    guard = Resilience.for_app(app).runtime.guard
    assert guard.done_by(None, "shop.pay:order:o-1:EUR") == "a"
    assert guard.done_by(None, "shop.note:order:o-1") == "d"
    assert calls == ["o-1 EUR", "o-1 USD", "note o-1"]
    assert "Could not render" not in caplog.text


@pytest.mark.parametrize(
    ("option", "argument"),
    [
        (lambda order_id: None, "o-1"),
        (lambda order_id: "", "o-1"),
        ("order:{order_id}", None),
        ("{order_id}", ""),
    ],
    ids=["callable-None", "callable-empty", "field-None", "rendered-empty"],
)
def test_a_key_of_none_or_nothing_deduplicates_by_task_id_with_an_error_line(
    app: Celery, caplog: pytest.LogCaptureFixture, option: Any, argument: Any
) -> None:
    calls: list[str] = []

    @app.task(base=ResilientTask, shared=False, name="shop.pack", deduplicate=option)
    def pack(order_id: Any) -> None:
        calls.append("ran")

    # Two task ids: neither is a duplicate of the other (no one key shared by every delivery)
    assert pack.apply((argument,), task_id="p-1").state == states.SUCCESS
    assert pack.apply((argument,), task_id="p-2").state == states.SUCCESS
    assert pack.apply((argument,), task_id="p-1").state == states.IGNORED  # the id: done
    assert calls == ["ran", "ran"]
    assert "Could not render the dedup key of shop.pack[p-1]" in caplog.text
