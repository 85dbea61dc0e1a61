"""``ResilientTask`` run in-process with ``task_always_eager``: success, retries with backoff,
the breaker, parking (every reason), deduplication, the redelivery guard, a full or unreachable
store, and direct calls.

Every behaviour test runs against both backends (``make_app`` is parametrized): ``redis`` (the
default ``Resilience`` on the real Redis, under this test's key prefix) and ``memory``
(in-process breaker and back-out stores installed with ``Resilience.install``).

What eager mode does (observed with Celery 5.7, relied on below):
- ``self.retry(countdown=...)`` runs the retry at once, recursively, inside ``apply()``, with the
  same task id and ``request.retries + 1``; ``apply()`` returns the innermost call's result.
- a parked task raises ``Ignore`` after the entry is stored: its ``EagerResult`` state is
  ``IGNORED`` (no ``PARKED`` state and no ``task-parked`` event in eager mode).
"""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from celery import Celery, current_task, states
from celery.app.trace import build_tracer

from celery_resilience import (
    BreakerOpen,
    BulkheadFull,
    Resilience,
    ResilientTask,
    StoreUnavailable,
    backoff,
)
from celery_resilience.backout import MemoryBackoutStore, ParkedTask, StoreFull
from celery_resilience.breaker import MemoryBreakerStore
from celery_resilience.config import ResilienceConfig
from celery_resilience.headers import REPLAYS_HEADER, TURNED_AWAY_HEADER, body_digest, entry_id

pytestmark = pytest.mark.integration

BREAKERS = {
    # Roomy: a whole retry chain fails without opening it.
    "dep": {"failure_threshold": 10, "open_timeout": 30.0},
    # Opens after two failures.
    "fragile": {"failure_threshold": 2, "open_timeout": 30.0},
}
PARK_LOGGER = "celery_resilience.park"


class DependencyDown(ConnectionError):
    """Transient: the dependency did not answer."""


class NotNow(Exception):
    """The dependency answered "come back later": park at once."""


class Bug(Exception):
    """The task's own failure: not the dependency's fault."""


@dataclass
class RecordingBackoff:
    """``base * 2**attempt``, deterministic, remembering every attempt it was asked about."""

    base: float = 0.5
    attempts: list[int] = field(default_factory=list)

    def __call__(self, attempt: int) -> float:
        self.attempts.append(attempt)
        return self.base * 2.0**attempt

    def max_delay(self) -> float:
        return 3600.0


MakeApp = Callable[..., Celery]


def _app(redis_url: str, key_prefix: str, settings: dict[str, Any]) -> Celery:
    app = Celery("t", broker=redis_url, set_as_current=False)
    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = False
    app.conf.resilience_key_prefix = key_prefix
    app.conf.resilience_redis_url = redis_url
    app.conf.resilience_breakers = BREAKERS
    app.conf.update(settings)
    return app


def _close(apps: list[Celery]) -> None:
    for app in apps:
        Resilience.for_app(app).runtime.close()


@pytest.fixture(params=["redis", "memory"])
def make_app(request: pytest.FixtureRequest, redis_url: str, key_prefix: str) -> Iterator[MakeApp]:
    """An eager app whose ``Resilience`` uses the parametrized backend; ``**settings`` go to
    ``app.conf`` before the settings are read."""
    made: list[Celery] = []

    def make(**settings: Any) -> Celery:
        app = _app(redis_url, key_prefix, settings)
        if request.param == "memory":
            config = ResilienceConfig.from_app(app)
            stores = Resilience(
                app,
                config,
                breaker_store=MemoryBreakerStore(),
                backout=MemoryBackoutStore(max_entries=config.backout_max_entries),
            )
            Resilience.install(app, stores)
        made.append(app)
        return app

    yield make
    _close(made)


@pytest.fixture
def app(make_app: MakeApp) -> Celery:
    return make_app()


def resilient(app: Celery, **options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``@app.task(base=ResilientTask, bind=True, **options)``, registered at once, on ``app``
    only (``shared=False``: a shared task would be added to every app made afterwards)."""
    task: Callable[[Callable[..., Any]], Any] = app.task(
        base=ResilientTask, bind=True, shared=False, lazy=False, **options
    )
    return task


def resilience(app: Celery) -> Resilience:
    return Resilience.for_app(app)


def parked(app: Celery) -> list[ParkedTask]:
    return resilience(app).backout.list()


def only_entry(app: Celery) -> ParkedTask:
    entries = parked(app)
    assert len(entries) == 1, entries
    return entries[0]


def snapshot(app: Celery, breaker: str) -> dict[str, Any]:
    b = resilience(app).breaker(breaker)
    b.flush()  # deferred successes
    return b.snapshot()


def spy_countdowns(monkeypatch: pytest.MonkeyPatch, task: Any) -> list[float]:
    """The ``countdown`` of every ``self.retry`` the task asks for."""
    countdowns: list[float] = []
    original = task.retry

    def retry(*args: Any, **kwargs: Any) -> Any:
        countdowns.append(kwargs["countdown"])
        return original(*args, **kwargs)

    monkeypatch.setattr(task, "retry", retry)
    return countdowns


def park_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == PARK_LOGGER and r.levelno >= logging.ERROR
    ]


def trip(app: Celery, breaker: str) -> None:
    b = resilience(app).breaker(breaker)
    while b.state == "closed":
        b.acquire().failure()
    assert b.state == "open"


# -- success ------------------------------------------------------------------------------------


def test_success_returns_the_value_records_a_success_and_parks_nothing(app: Celery) -> None:
    @resilient(app, breaker="dep")
    def double(self: Any, x: int) -> int:
        return x * 2

    result = double.apply((21,))

    assert (result.state, result.result) == (states.SUCCESS, 42)
    snap = snapshot(app, "dep")
    assert (snap["state"], snap["window_calls"], snap["window_failures"]) == ("closed", 1, 0)
    assert parked(app) == []


# -- retry_on -----------------------------------------------------------------------------------


def test_transient_error_is_retried_with_backoff_delays_then_parked_as_retries_exhausted(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    strategy = RecordingBackoff(base=0.5)
    seen: list[tuple[str, int]] = []

    @resilient(app, breaker="dep", retry_on=(DependencyDown,), max_retries=3, backoff=strategy)
    def charge(self: Any, order: int, currency: str) -> None:
        seen.append((self.request.id, self.request.retries))
        raise DependencyDown("gateway down")

    countdowns = spy_countdowns(monkeypatch, charge)

    result = charge.apply((7,), {"currency": "EUR"}, task_id="order-7")

    # Eager retries run at once: the first call and 3 retries, all with the same task id.
    assert seen == [("order-7", 0), ("order-7", 1), ("order-7", 2), ("order-7", 3)]
    assert countdowns == [0.5, 1.0, 2.0]  # backoff(0), backoff(1), backoff(2)
    # One more attempt is asked for: the parked entry is due one backoff step later.
    assert strategy.attempts == [0, 1, 2, 3]
    assert (result.id, result.state) == ("order-7", states.IGNORED)

    entry = only_entry(app)
    assert entry.id == entry_id("order-7", 0, 3, body_digest((7,), {"currency": "EUR"}))
    assert (entry.reason, entry.status, entry.retries, entry.replays) == (
        "retries_exhausted",
        "parked",
        3,
        0,
    )
    assert (entry.task_name, entry.task_id, entry.breaker) == (charge.name, "order-7", "dep")
    assert (entry.args, entry.kwargs) == ([7], {"currency": "EUR"})
    assert entry.exc_type == f"{__name__}.DependencyDown"
    assert entry.exc_message == "gateway down"
    assert "DependencyDown: gateway down" in entry.traceback
    assert "in charge" in entry.traceback  # the body's frame
    assert entry.due_at == pytest.approx(entry.parked_at + 4.0, abs=0.01)  # backoff(3)
    # Every attempt was a breaker failure (the roomy breaker stays closed).
    snap = snapshot(app, "dep")
    assert (snap["state"], snap["consecutive_failures"], snap["window_failures"]) == (
        "closed",
        4,
        4,
    )


# -- the breaker --------------------------------------------------------------------------------


def test_a_plain_function_as_the_backoff_option_gets_the_attempt(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "Any Callable[[int], float] is a strategy": a lambda given as a task option is not bound
    # to the task as a method would be.
    @resilient(
        app,
        breaker="dep",
        retry_on=(DependencyDown,),
        max_retries=2,
        backoff=lambda attempt: 0.25 * (attempt + 1),
    )
    def charge(self: Any) -> None:
        raise DependencyDown("gateway down")

    countdowns = spy_countdowns(monkeypatch, charge)

    charge.apply(task_id="lambda-backoff")

    assert countdowns == [0.25, 0.5]
    assert only_entry(app).reason == "retries_exhausted"


def test_breaker_opens_after_failure_threshold_and_a_later_delivery_is_parked_unrun(
    app: Celery,
) -> None:
    calls: list[int] = []

    @resilient(app, breaker="fragile", retry_on=(DependencyDown,), max_retries=0)
    def enrich(self: Any, n: int) -> None:
        calls.append(n)
        raise DependencyDown("enrichment API down")

    # Given two failures (the threshold): each parked at once (max_retries=0), breaker open.
    enrich.apply((1,))
    enrich.apply((2,))
    assert [e.reason for e in parked(app)] == ["retries_exhausted"] * 2
    assert resilience(app).breaker("fragile").state == "open"

    # When a third delivery comes, then it is parked without calling the dependency.
    result = enrich.apply((3,), task_id="third")

    assert calls == [1, 2]
    assert result.state == states.IGNORED
    entry = resilience(app).backout.get(entry_id("third", 0, 0, body_digest((3,), {})))
    assert entry is not None
    assert (entry.reason, entry.breaker, entry.args, entry.retries) == (
        "breaker_open",
        "fragile",
        [3],
        0,
    )
    assert entry.exc_type == f"{BreakerOpen.__module__}.BreakerOpen"
    assert "'fragile' is open" in entry.exc_message
    assert entry.due_at == entry.parked_at  # due at once: the drain waits for the breaker


def test_on_open_retry_waits_out_the_open_breaker_then_parks_as_breaker_open(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    @resilient(app, breaker="fragile", on_open="retry", max_retries=2)
    def enrich(self: Any, n: int) -> int:
        calls.append(n)
        return n

    countdowns = spy_countdowns(monkeypatch, enrich)
    trip(app, "fragile")  # open_timeout 30 s
    open_until = snapshot(app, "fragile")["open_until"]

    result = enrich.apply((1,), task_id="waits")

    # Each retry waits for the breaker's remaining open time, not the backoff.
    assert len(countdowns) == 2
    remaining = open_until - resilience(app).runtime.now()
    for countdown in countdowns:
        assert remaining - 0.5 < countdown <= 30.0
    # Retries ran out while the breaker stayed open: parked, the body never ran.
    assert calls == []
    assert result.state == states.IGNORED
    entry = only_entry(app)
    assert (entry.reason, entry.task_id, entry.retries) == ("breaker_open", "waits", 2)
    assert entry.exc_type.endswith("BreakerOpen")


def test_a_full_bulkhead_in_eager_mode_parks_the_delivery_unrun_and_a_free_slot_runs_it(
    make_app: MakeApp,
) -> None:
    # A worker keeps such a delivery in the broker; eager mode has no broker to wait in (and
    # retries at once, recursively): on_open decides, here "park", at once, no attempt spent.
    app = make_app(resilience_breakers={"gateway": {"max_concurrent_calls": 1}})
    calls: list[int] = []

    @resilient(app, breaker="gateway", retry_on=(DependencyDown,), max_retries=None)
    def charge(self: Any, n: int) -> int:
        calls.append(n)
        return n

    held = resilience(app).breaker("gateway").acquire()  # a call in flight elsewhere

    result = charge.apply((1,), task_id="turned-away")

    assert calls == []
    assert result.state == states.IGNORED
    entry = only_entry(app)
    assert (entry.reason, entry.task_id, entry.retries) == ("breaker_open", "turned-away", 0)
    assert entry.exc_type == f"{BulkheadFull.__module__}.BulkheadFull"
    held.success()
    assert charge.apply((2,)).get() == 2
    assert calls == [2]
    assert resilience(app).breaker("gateway").snapshot()["calls_in_flight"] == 0


def test_on_open_retry_into_a_full_bulkhead_ends_in_eager_mode(make_app: MakeApp) -> None:
    # Eager retries run at once, recursively: with the slot held all along they must still end.
    app = make_app(resilience_breakers={"gateway": {"max_concurrent_calls": 1}})

    @resilient(app, breaker="gateway", on_open="retry", max_retries=2)
    def charge(self: Any, n: int) -> int:
        return n

    resilience(app).breaker("gateway").acquire()
    result = charge.apply((1,), task_id="bounced")

    assert result.state == states.IGNORED
    entry = only_entry(app)
    assert (entry.reason, entry.retries) == ("breaker_open", 2)


# -- park_on ------------------------------------------------------------------------------------


def test_park_on_parks_at_once_without_retrying(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    @resilient(app, breaker="dep", retry_on=(DependencyDown,), park_on=(NotNow,), max_retries=3)
    def ship(self: Any, n: int) -> None:
        calls.append(self.request.retries)
        raise NotNow("warehouse closed until Monday")

    countdowns = spy_countdowns(monkeypatch, ship)

    result = ship.apply((5,), task_id="ship-5")

    assert calls == [0]
    assert countdowns == []
    assert result.state == states.IGNORED
    entry = only_entry(app)
    assert (entry.reason, entry.task_id, entry.retries, entry.args) == (
        "park_on",
        "ship-5",
        0,
        [5],
    )
    assert entry.exc_message == "warehouse closed until Monday"
    # The dependency answered: not a breaker failure.
    snap = snapshot(app, "dep")
    assert (snap["consecutive_failures"], snap["window_failures"]) == (0, 0)


# -- other exceptions ---------------------------------------------------------------------------


def test_park_on_is_due_later_with_each_replay(make_app: MakeApp) -> None:
    # The dependency keeps saying "not now": the drain must not ask again at every run.
    app = make_app(resilience_park_on_delay=60.0)

    @resilient(app, breaker="dep", park_on=(NotNow,))
    def ship(self: Any) -> None:
        raise NotNow("come back later")

    waits = []
    for replays in range(4):
        ship.apply(task_id=f"ship-{replays}", headers={REPLAYS_HEADER: replays})
        digest = body_digest((), {})
        entry = resilience(app).backout.get(entry_id(f"ship-{replays}", replays, 0, digest))
        assert entry is not None
        waits.append(entry.due_at - entry.parked_at)
    for replays, wait in enumerate(waits):  # equal jitter: between half and all of 60 * 2**n
        assert 30.0 * 2**replays <= wait <= 60.0 * 2**replays, (replays, wait)


def test_other_exception_is_a_plain_failure_not_counted_by_the_breaker(app: Celery) -> None:
    @resilient(app, breaker="fragile", retry_on=(DependencyDown,), max_retries=3)
    def validate(self: Any, n: int) -> None:
        raise Bug(f"bad input {n}")

    # More failures than the breaker's threshold (2).
    results = [validate.apply((n,)) for n in range(3)]

    assert [r.state for r in results] == [states.FAILURE] * 3
    assert isinstance(results[0].result, Bug)
    snap = snapshot(app, "fragile")
    assert (snap["state"], snap["consecutive_failures"], snap["window_failures"]) == (
        "closed",
        0,
        0,
    )
    assert parked(app) == []


def test_other_exception_propagates_when_eager_propagates(make_app: MakeApp) -> None:
    app = make_app(task_eager_propagates=True)

    @resilient(app, breaker="fragile", retry_on=(DependencyDown,))
    def validate(self: Any) -> None:
        raise Bug("bad input")

    with pytest.raises(Bug, match="bad input"):
        validate.apply()
    assert snapshot(app, "fragile")["window_failures"] == 0
    assert parked(app) == []


# -- delay too long -----------------------------------------------------------------------------


def test_retry_delay_longer_than_max_countdown_is_parked_with_due_at(
    make_app: MakeApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = make_app(resilience_max_countdown=5)
    calls: list[int] = []

    @resilient(
        app,
        breaker="dep",
        retry_on=(DependencyDown,),
        max_retries=3,
        backoff=backoff.Constant(60.0),
    )
    def sync(self: Any) -> None:
        calls.append(self.request.retries)
        raise DependencyDown("down")

    countdowns = spy_countdowns(monkeypatch, sync)

    result = sync.apply(task_id="slow")

    # 60 s would outlive what the broker holds safely (5 s here): parked instead of retried.
    assert (calls, countdowns, result.state) == ([0], [], states.IGNORED)
    entry = only_entry(app)
    assert (entry.reason, entry.task_id, entry.retries) == ("delay_too_long", "slow", 0)
    assert entry.due_at == pytest.approx(entry.parked_at + 60.0, abs=0.01)


# -- deduplicate, redelivery guard, idempotent parking ------------------------------------------


@pytest.mark.parametrize("breaker", ["dep", None])
def test_deduplicate_skips_a_task_id_that_already_succeeded(
    app: Celery, breaker: str | None
) -> None:
    calls: list[int] = []

    @resilient(app, breaker=breaker, deduplicate=True)
    def refund(self: Any, n: int) -> int:
        calls.append(n)
        return n

    first = refund.apply((1,), task_id="refund-1")
    again = refund.apply((1,), task_id="refund-1")
    other = refund.apply((2,), task_id="refund-2")

    assert (first.state, first.result) == (states.SUCCESS, 1)
    assert again.state == states.IGNORED
    assert (other.state, other.result) == (states.SUCCESS, 2)
    assert calls == [1, 2]
    assert parked(app) == []


@pytest.mark.parametrize("breaker", ["dep", None])
def test_message_redelivered_past_max_deliveries_is_parked_unrun(
    make_app: MakeApp, breaker: str | None
) -> None:
    app = make_app(resilience_max_deliveries=2)
    calls: list[int] = []

    @resilient(app, breaker=breaker, acks_late=True)
    def render(self: Any, n: int) -> int:
        calls.append(n)
        return n

    # The same message (task id, retries 0) delivered, then redelivered twice (as the broker
    # flags it); a first delivery is never counted.
    first = render.apply((9,), task_id="looping")
    again = [render.apply((9,), task_id="looping", headers={"redelivered": True}) for _ in "ab"]
    results = [first, *again]

    assert [r.state for r in results] == [states.SUCCESS, states.SUCCESS, states.IGNORED]
    assert calls == [9, 9]
    entry = only_entry(app)
    assert (entry.reason, entry.task_id, entry.retries, entry.args) == (
        "redelivered",
        "looping",
        0,
        [9],
    )
    assert (entry.breaker, entry.exc_type) == (breaker, "")


def test_parking_the_same_delivery_twice_keeps_one_entry(app: Celery) -> None:
    calls: list[int] = []

    @resilient(app, breaker="dep", park_on=(NotNow,))
    def ship(self: Any) -> None:
        calls.append(1)
        raise NotNow("later")

    ship.apply(task_id="twice")
    first = only_entry(app)
    ship.apply(task_id="twice")  # the same message again (a redelivery after a crash)

    assert len(calls) == 2
    assert only_entry(app) == first
    assert first.id == entry_id("twice", 0, 0, body_digest((), {}))


# -- the store refuses --------------------------------------------------------------------------


def test_full_store_never_drops_the_task_in_silence(
    make_app: MakeApp, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(resilience_backout_max_entries=1)
    calls: list[tuple[str, int]] = []

    @resilient(app, breaker="dep", park_on=(NotNow,), max_retries=2)
    def ship(self: Any) -> None:
        calls.append((self.request.id, self.request.retries))
        raise NotNow("later")

    ship.apply(task_id="fits")
    assert resilience(app).backout.count() == 1

    with caplog.at_level(logging.ERROR, logger=PARK_LOGGER):
        result = ship.apply(task_id="refused")
        ship.apply(task_id="refused-too")

    # In eager mode there is no broker to keep the task in: the call fails loudly with the
    # store's error, at once. Nothing was evicted, and the cause is logged once, not per task.
    assert calls[1:] == [("refused", 0), ("refused-too", 0)]
    assert result.state == states.FAILURE
    assert "back-out store is full" in str(result.result)
    assert [e.task_id for e in parked(app)] == ["fits"]
    errors = park_errors(caplog)
    assert len(errors) == 1
    assert f"Could not park {ship.name}[refused] (park_on)" in errors[0]
    assert "StoreFull" in errors[0]


def _trace_and_fetch(
    app: Celery, task: Any, task_id: str, headers: dict[str, Any] | None = None, retries: int = 0
) -> Any:
    """Run one delivery as a worker's trace would (its outcome: a retry), and return the
    message it sent again."""
    queue = f"resilience-test-{uuid.uuid4().hex}"
    headers = headers or {}
    request = {
        "id": task_id,
        "retries": retries,
        "headers": headers,
        **headers,
        "delivery_info": {"exchange": "", "routing_key": queue},
    }
    outcome = build_tracer(task.name, task, app=app)(task_id, [], {}, request)
    assert outcome.info.state == states.RETRY
    with app.connection_for_read() as conn:
        simple = conn.SimpleQueue(queue)
        try:
            message = simple.get(timeout=2)
            message.ack()
        finally:
            simple.close()
    return message


def test_full_store_in_a_worker_keeps_an_exhausted_task_in_the_broker(
    make_app: MakeApp,
) -> None:
    """Outside eager mode (a worker's trace, the in-memory broker): a task on its last retry
    whose park is refused is published again as it was (same id, same retries, in
    ``resilience_keep_delay`` seconds), not failed by Celery's ``max_retries`` check."""
    app = make_app(
        broker_url="memory://", task_always_eager=False, resilience_backout_max_entries=1
    )
    resilience(app).runtime.backout_store.park(
        ParkedTask.new(task_name="other", task_id="fills-the-store", reason="park_on")
    )

    @resilient(app, breaker="dep", retry_on=(DependencyDown,), max_retries=1)
    def charge(self: Any) -> None:
        raise DependencyDown("gateway down")

    task_id = uuid.uuid4().hex
    # The last allowed delivery (retries == max_retries), as a worker would run it.
    message = _trace_and_fetch(app, charge, task_id, retries=1)

    assert (message.headers["id"], message.headers["retries"]) == (task_id, 1)
    assert message.headers["eta"]  # kept in the broker for resilience_keep_delay
    assert "override_max_retries" not in vars(charge)
    assert [e.task_id for e in parked(app)] == ["fills-the-store"]


# -- called directly ----------------------------------------------------------------------------


def test_called_directly_runs_the_body_without_the_breaker_or_the_store(app: Celery) -> None:
    @resilient(app, breaker="fragile", retry_on=(DependencyDown,), park_on=(NotNow,))
    def charge(self: Any, n: int) -> tuple[Any, bool]:
        if n < 0:
            raise NotNow("no")
        return self.request.args, current_task._get_current_object() is self

    assert charge(5) == ((5,), True)  # Celery's direct call: request and current_task set
    with pytest.raises(NotNow):  # not parked: a direct call is a plain function call
        charge(-1)

    snap = snapshot(app, "fragile")
    assert (snap["window_calls"], snap["window_failures"]) == (0, 0)
    assert parked(app) == []


# -- Redis unreachable (the Redis backend only: the memory stores never talk to Redis) ---------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def make_down_app(key_prefix: str) -> Iterator[Callable[[str], Celery]]:
    """An eager app whose Redis refuses connections (timeout 0.2 s) under ``policy``."""
    made: list[Celery] = []
    url = f"redis://127.0.0.1:{_closed_port()}/15"

    def make(policy: str) -> Celery:
        app = _app(
            url,
            key_prefix,
            {"resilience_redis_timeout": 0.2, "resilience_on_redis_error": policy},
        )
        made.append(app)
        return app

    yield make
    _close(made)


def test_redis_down_fail_open_runs_the_task(
    make_down_app: Callable[[str], Celery], caplog: pytest.LogCaptureFixture
) -> None:
    app = make_down_app("fail_open")

    @resilient(app, breaker="dep", retry_on=(DependencyDown,))
    def double(self: Any, x: int) -> int:
        return x * 2

    with caplog.at_level(logging.ERROR, logger="celery_resilience.breaker"):
        result = double.apply((4,))

    assert (result.state, result.result) == (states.SUCCESS, 8)
    assert any("Redis unreachable" in r.getMessage() for r in caplog.records)


def test_redis_down_called_directly_needs_no_redis(
    make_down_app: Callable[[str], Celery],
) -> None:
    app = make_down_app("fail_closed")

    @resilient(app, breaker="dep")
    def double(self: Any, x: int) -> int:
        return x * 2

    assert double(4) == 8


def test_redis_down_fail_closed_cannot_park_and_fails_loudly(
    make_down_app: Callable[[str], Celery], caplog: pytest.LogCaptureFixture
) -> None:
    """fail_closed rejects the call and the store is down too: parking is refused. In a worker
    the message is kept in the broker; in eager mode, with no broker, the call fails at once
    with ``StoreUnavailable``, logged."""
    app = make_down_app("fail_closed")
    calls: list[int] = []

    @resilient(app, breaker="dep", max_retries=2)
    def double(self: Any, x: int) -> int:
        calls.append(x)
        return x * 2

    with caplog.at_level(logging.ERROR, logger=PARK_LOGGER):
        result = double.apply((4,), task_id="unparkable")

    assert calls == []
    assert result.state == states.FAILURE
    assert isinstance(result.result, StoreUnavailable)
    errors = park_errors(caplog)
    assert len(errors) == 1
    assert f"Could not park {double.name}[unparkable] (breaker_open)" in errors[0]


def test_redis_down_fail_open_exhausted_task_fails_loudly(
    make_down_app: Callable[[str], Celery], caplog: pytest.LogCaptureFixture
) -> None:
    """fail_open lets the call through; it fails with a transient error on its last retry and
    the store can't take it: in eager mode that is a FAILURE naming the store's trouble."""
    app = make_down_app("fail_open")

    @resilient(app, breaker="dep", retry_on=(DependencyDown,), max_retries=0)
    def charge(self: Any) -> None:
        raise DependencyDown("gateway down")

    with caplog.at_level(logging.ERROR, logger=PARK_LOGGER):
        result = charge.apply(task_id="lost?")

    assert result.state == states.FAILURE
    assert isinstance(result.result, StoreUnavailable)
    assert any(
        f"Could not park {charge.name}[lost?] (retries_exhausted)" in r.getMessage()
        for r in caplog.records
    )


def test_a_failure_from_a_full_store_keeps_its_exception_type(make_app: MakeApp) -> None:
    app = make_app(resilience_backout_max_entries=1)

    @resilient(app, breaker="dep", park_on=(NotNow,), max_retries=0)
    def ship(self: Any) -> None:
        raise NotNow("later")

    ship.apply(task_id="fits")
    result = ship.apply(task_id="refused")

    assert isinstance(result.result, StoreFull)


def test_a_full_bulkhead_met_inside_the_body_spends_an_attempt_like_any_retry_on_error(
    make_app: MakeApp,
) -> None:
    # Only the task's own admission turned away unrun spends nothing: a body that calls another
    # breaker and meets its full bulkhead has run (and may have done things): its retries count.
    app = make_app(resilience_breakers={"other": {"max_concurrent_calls": 1}})
    other = resilience(app).breaker("other")
    other.acquire()  # a call in flight elsewhere
    runs: list[int] = []

    @resilient(app, retry_on=(BulkheadFull,), max_retries=2)
    def lookup(self: Any, n: int) -> int:
        runs.append(self.request.retries or 0)
        return int(other.call(lambda: n))

    result = lookup.apply((1,), task_id="inner-bulkhead")

    assert runs == [0, 1, 2]
    assert result.state == states.IGNORED
    entry = only_entry(app)
    assert (entry.reason, entry.retries) == ("breaker_open", 2)  # its cause was a BreakerOpen


# -- a full bulkhead in a worker: turned away, backing off per turn-away ----------------------


def test_each_turn_away_by_a_full_bulkhead_waits_longer_up_to_the_open_timeout(
    make_app: MakeApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a worker's delivery (not eager) whose breaker's only bulkhead slot is taken
    app = make_app(
        broker_url="memory://",
        task_always_eager=False,
        resilience_breakers={"gateway": {"max_concurrent_calls": 1, "open_timeout": 3.0}},
    )
    calls: list[int] = []

    @resilient(
        app,
        breaker="gateway",
        retry_on=(DependencyDown,),
        max_retries=2,
        backoff=backoff.Exponential(base=1.0, cap=300.0, jitter=None),
    )
    def charge(self: Any) -> None:
        calls.append(1)
        raise DependencyDown("gateway down")

    countdowns: list[float] = []  # of each message published again
    signature_from_request = charge.signature_from_request

    def spy(request: Any = None, **options: Any) -> Any:
        if "countdown" in options:
            countdowns.append(options["countdown"])
        return signature_from_request(request, **options)

    monkeypatch.setattr(charge, "signature_from_request", spy)
    held = resilience(app).breaker("gateway").acquire()  # the dependency hangs

    # When the same delivery is turned away again and again
    headers: dict[str, Any] = {}
    seen = []
    for _ in range(4):
        message = _trace_and_fetch(app, charge, "turned-away", headers)
        headers = {k: v for k, v in message.headers.items() if k == TURNED_AWAY_HEADER}
        seen.append((message.headers["retries"], headers[TURNED_AWAY_HEADER]))

    # Then it never ran, spent no attempt, counted each turn-away, and waited the task's
    # backoff for that count, capped at the breaker's open timeout (1, 2, 3, 3 s)
    assert calls == []
    assert seen == [(0, 1), (0, 2), (0, 3), (0, 4)]
    assert countdowns == [1.0, 2.0, 3.0, 3.0]
    assert parked(app) == []
    # and parked once its breaker is open, its entry does not keep the count: a replay meets
    # the bulkhead afresh
    breaker = resilience(app).breaker("gateway")
    breaker.force_open()
    request = {"id": "turned-away", "retries": 0, "headers": headers, **headers}
    build_tracer(charge.name, charge, app=app)("turned-away", [], {}, request)
    entry = only_entry(app)
    assert entry.reason == "breaker_open"
    assert TURNED_AWAY_HEADER not in entry.options.get("headers", {})
    breaker.reset()

    # And once a slot is free the body runs: its retry spends an attempt and counts afresh
    held.success()
    message = _trace_and_fetch(app, charge, "turned-away", headers)
    assert calls == [1]
    assert message.headers["retries"] == 1
    assert TURNED_AWAY_HEADER not in message.headers
