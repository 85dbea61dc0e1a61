"""The retry budget and Retry-After: what a failure says of its retry, the fate it gets, the
breaker's budget on real Redis (and in memory, the model the scripts follow), a trip that keeps
the breaker open as long as the dependency asked, the drain's replays spending the budget, and
the settings' checks. The worker's side (a brownout, a 429) is ``tests/test_overload_worker.py``.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from typing import Any

import pytest
import requests

from celery_resilience.backoff import RETRY_AFTER_SPREAD, Exponential, at_least, retry_after
from celery_resilience.breaker import Breaker
from celery_resilience.cli.breakers import budget_line
from celery_resilience.config import BreakerConfig, ResilienceConfig
from celery_resilience.delivery.context import Options
from celery_resilience.delivery.ending import Transient, body_ended
from celery_resilience.delivery.fate import Facts, Park, Retry, budgeted, decide
from tests.support.resilience import MakeResilience
from tests.support.round_trips import RoundTrips

T0 = 1_700_000_000.0
UTC = timezone.utc


class TooMany(Exception):
    def __init__(self, retry_after: Any) -> None:
        super().__init__("429")
        self.retry_after = retry_after


class Response:
    """What ``requests`` and ``httpx`` responses have in common here: ``headers``."""

    def __init__(self, **headers: str) -> None:
        self.headers = requests.structures.CaseInsensitiveDict(headers)


# -- what a failure says of its retry -------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize(
    ("said", "seconds"),
    [
        (3, 3.0),
        (2.5, 2.5),
        (timedelta(minutes=2), 120.0),
        (datetime.fromtimestamp(T0 + 7, UTC), 7.0),
        (datetime.fromtimestamp(T0 - 7, UTC), 0.0),  # already past: at once
        (datetime.fromtimestamp(T0 + 7), None),  # naive: names no moment
        (-1, None),
        (float("inf"), None),
        (True, None),
        ("12", 12.0),
        (None, None),
    ],
)
def test_an_exceptions_retry_after_is_read_as_seconds(said: Any, seconds: float | None) -> None:
    assert retry_after(TooMany(said), T0) == seconds


@pytest.mark.unit
@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("30", 30.0),
        (" 30 ", 30.0),
        (format_datetime(datetime.fromtimestamp(T0 + 90, UTC), usegmt=True), 90.0),
        ("soon", None),
        ("", None),
    ],
)
def test_the_retry_after_header_of_an_http_error_is_read(header: str, seconds: float) -> None:
    error = requests.HTTPError(
        "429 Too Many Requests", response=Response(**{"retry-after": header})
    )
    assert retry_after(error, T0) == seconds


@pytest.mark.unit
def test_an_http_error_without_a_response_or_header_says_nothing() -> None:
    assert retry_after(requests.HTTPError("boom"), T0) is None
    assert retry_after(requests.HTTPError("boom", response=Response()), T0) is None
    assert retry_after(ConnectionError("down"), T0) is None


@pytest.mark.unit
def test_jitter_only_adds_to_a_retry_after() -> None:
    assert at_least(None, 0.3) == 0.3
    assert at_least(3.0, 0.0) == 3.0
    assert at_least(3.0, 0.2) == pytest.approx(3.2)
    assert at_least(3.0, 2.9) == pytest.approx(3.0 + 3.0 * RETRY_AFTER_SPREAD)
    assert at_least(3.0, 8.0) == 8.0  # a longer backoff is kept


# -- the fate ----------------------------------------------------------------------------
CONFIG = ResilienceConfig(
    redis_url="memory://",
    max_countdown=100.0,
    breakers={
        "dep": BreakerConfig(),
        "budgeted": BreakerConfig(retry_budget=0.1, min_retries_per_second=1.0),
    },
)
TASK = Options(max_retries=5, backoff=Exponential(base=1.0, jitter="full"), breaker="dep")
BUDGETED = dataclasses.replace(TASK, breaker="budgeted")


@pytest.mark.unit
def test_a_retry_waits_at_least_what_the_failure_asked() -> None:
    ended = body_ended(TooMany(3), (TooMany,), ())
    assert isinstance(ended, Transient)
    assert ended.retry_after == 3.0
    for retries in range(5):
        fate = decide(ended, Facts("t1", retries=retries), TASK, CONFIG)
        assert isinstance(fate, Retry)
        assert fate.countdown >= 3.0
        assert not fate.spends  # no budget on "dep"


@pytest.mark.unit
def test_a_retry_after_past_max_countdown_parks_as_delay_too_long() -> None:
    fate = decide(Transient(TooMany(500), 500.0), Facts("t1"), TASK, CONFIG)
    assert isinstance(fate, Park)
    assert fate.reason == "delay_too_long"
    assert 500.0 <= fate.due_in <= 500.0 * (1 + RETRY_AFTER_SPREAD)


@pytest.mark.unit
def test_a_retry_through_a_budgeted_breaker_spends_and_parks_when_refused() -> None:
    down = ConnectionError("down")
    fate = decide(Transient(down), Facts("t1"), BUDGETED, CONFIG)
    assert isinstance(fate, Retry)
    assert fate.spends
    assert budgeted(fate, True) is fate
    assert budgeted(fate, False) == Park("retry_budget", down, fate.countdown)
    # an eager call retries at once in its caller: nothing to spend
    eager = decide(Transient(down), Facts("t1", eager=True), BUDGETED, CONFIG)
    assert isinstance(eager, Retry)
    assert not eager.spends


# -- the breaker's budget on Redis (and in memory) ---------------------------------------
def budget(**options: Any) -> dict[str, Any]:
    return {"dep": {"failure_threshold": 1000, "window": 60.0, **options}}


@pytest.fixture(params=["redis", "memory"])
def make_breaker(request: pytest.FixtureRequest, make_resilience: MakeResilience) -> Any:
    def make(**options: Any) -> Breaker:
        res = make_resilience(kind=request.param, breakers=budget(**options))
        return res.breaker("dep")

    return make


def calls(breaker: Breaker, successes: int, failures: int = 0) -> None:
    for _ in range(successes):
        breaker.call(lambda: None)
    for _ in range(failures):
        with pytest.raises(ConnectionError):
            breaker.call(_down)
    breaker.flush()


def _down() -> None:
    raise ConnectionError("down")


@pytest.mark.integration
def test_retries_add_at_most_the_budgets_share_of_first_attempts(make_breaker: Any) -> None:
    breaker = make_breaker(retry_budget=0.2, min_retries_per_second=0.0)
    calls(breaker, successes=30, failures=20)  # 50 first attempts
    granted = 0
    for _ in range(20):  # each retry made (and failing) once granted
        if breaker.retry_allowed():
            granted += 1
            calls(breaker, successes=0, failures=1)
    assert granted == 10  # 20 % of 50
    snap = breaker.snapshot()
    assert (snap["window_retries"], snap["retry_budget_refused_total"]) == (10, 10)
    assert snap["window_calls"] == 60
    # new first attempts make room: 5 more allow one more retry
    calls(breaker, successes=5)
    assert breaker.retry_allowed()
    assert not breaker.retry_allowed()


@pytest.mark.integration
def test_a_batch_is_granted_against_the_retries_granted_before_it(make_breaker: Any) -> None:
    # the window's calls less the retries granted: a retry not yet made is no first attempt
    breaker = make_breaker(retry_budget=0.2, min_retries_per_second=0.0)
    calls(breaker, successes=50)
    assert breaker.spend_retries(20) == 10  # 10 <= 0.2 * 50
    assert breaker.spend_retries(1) == 0  # 50 calls, 10 granted: 40 first attempts known
    calls(breaker, successes=10)  # the 10 retries made: 50 first attempts again, no room
    assert breaker.spend_retries(1) == 0
    calls(breaker, successes=5)
    assert breaker.spend_retries(5) == 1


@pytest.mark.integration
def test_the_floor_grants_retries_a_second_over_the_window_without_first_attempts(
    make_breaker: Any,
) -> None:
    breaker = make_breaker(retry_budget=0.0, min_retries_per_second=0.1, window=60.0)
    assert breaker.spend_retries(10) == 6  # 0.1/s over 60 s
    assert breaker.spend_retries(1) == 0
    assert breaker.snapshot()["retry_budget_refused_total"] == 5


@pytest.mark.integration
def test_an_open_breaker_grants_retries_unspent_the_admission_turns_them_away(
    make_breaker: Any,
) -> None:
    breaker = make_breaker(retry_budget=0.0, min_retries_per_second=0.0)
    assert not breaker.retry_allowed()
    breaker.force_open()
    assert breaker.retry_allowed()
    assert breaker.snapshot()["window_retries"] == 0


@pytest.mark.integration
def test_without_a_budget_a_retry_is_allowed_with_no_round_trip(
    make_resilience: MakeResilience,
) -> None:
    breaker = make_resilience(breakers=budget()).breaker("dep")
    calls(breaker, successes=1)
    round_trips = RoundTrips(breaker)
    assert all(breaker.retry_allowed() for _ in range(100))
    assert round_trips.count == 0


@pytest.mark.integration
def test_a_trip_by_a_failure_with_retry_after_stays_open_at_least_that_long(
    make_resilience: MakeResilience,
) -> None:
    res = make_resilience(breakers={"dep": {"failure_threshold": 1, "open_timeout": 5.0}})
    breaker = res.breaker("dep")
    with pytest.raises(TooMany):
        breaker.call(_throttled, 120)
    snap = breaker.snapshot()
    assert snap["state"] == "open"
    assert snap["open_until"] - snap["opened_at"] == pytest.approx(120.0, abs=0.01)
    # an HTTP error's header counts the same; a shorter one leaves the open timeout alone
    breaker.reset()
    error = requests.HTTPError("429", response=Response(**{"Retry-After": "2"}))
    with pytest.raises(requests.HTTPError):
        breaker.call(_raise, error)
    snap = breaker.snapshot()
    assert snap["open_until"] - snap["opened_at"] == pytest.approx(5.0, abs=0.01)


def _throttled(seconds: float) -> None:
    raise TooMany(seconds)


def _raise(exc: Exception) -> None:
    raise exc


# -- settings (their checks: tests/test_config.py) -----------------------------------------
@pytest.mark.unit
def test_the_budget_is_off_by_default() -> None:
    config = BreakerConfig()
    assert (config.retry_budget, config.min_retries_per_second) == (None, 10.0)


@pytest.mark.unit
def test_status_names_a_breakers_budget_its_retries_and_its_refusals() -> None:
    snap = {
        "retry_budget": 0.1,
        "min_retries_per_second": 0.5,
        "window_retries": 12,
        "retry_budget_refused_total": 40,
    }
    assert budget_line("payments", snap) == (
        "payments: retry budget 10% + 0.5/s, 12 retries in the window, 40 refused (parked)"
    )
