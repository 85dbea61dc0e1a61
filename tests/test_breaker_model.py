"""The pure breaker state machine (the spec the Lua follows), one behaviour per test.

Time is pinned: every operation gets ``now`` in microseconds from a hand-advanced clock.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from celery_resilience.breaker import model
from celery_resilience.breaker.types import US, BreakerState, Change, Decision, Kind, Limits
from celery_resilience.config import BreakerConfig

pytestmark = pytest.mark.unit

S = 1_000_000  # one second in microseconds
T0 = 1_700_000_000 * S


class Pinned:
    """One breaker driven through the model with a clock that moves only when told."""

    def __init__(self, **options: Any) -> None:
        self.limits = Limits.of(BreakerConfig(**options))
        self.state = BreakerState()
        self.now = T0
        self._ids = (f"permit-{n}" for n in itertools.count())

    def advance(self, seconds: float) -> None:
        self.now += round(seconds * S)

    def acquire(self, deferred: int = 0) -> tuple[Decision, str]:
        permit_id = next(self._ids)
        return model.acquire(self.state, self.limits, self.now, permit_id, deferred), permit_id

    def permit(self) -> tuple[Kind, str]:
        decision, permit_id = self.acquire()
        assert decision.allowed, decision
        assert decision.kind is not None
        return decision.kind, permit_id

    def record(self, permit: tuple[Kind, str], success: bool, deferred: int = 0) -> Change:
        kind, permit_id = permit
        return model.record(self.state, self.limits, self.now, kind, permit_id, success, deferred)

    def call(self, success: bool) -> Change:
        return self.record(self.permit(), success)

    def fail(self, times: int = 1) -> list[Change]:
        return [self.call(False) for _ in range(times)]

    def trip(self) -> None:
        while self.state.state != "open":
            self.call(False)

    def snapshot(self) -> dict[str, object]:
        return model.snapshot(self.state, self.limits, self.now)


# -- closed -> open -------------------------------------------------------------------------
def test_failure_threshold_consecutive_failures_open_the_breaker() -> None:
    b = Pinned(failure_threshold=3)
    changes = b.fail(3)
    assert [c.transition for c in changes] == [None, None, "opened"]
    assert changes[-1].state == "open"
    assert b.snapshot()["opened_at"] == T0 / S


def test_a_success_between_failures_resets_the_consecutive_count() -> None:
    b = Pinned(failure_threshold=3)
    b.fail(2)
    b.call(True)
    changes = b.fail(2)
    assert [c.transition for c in changes] == [None, None]
    assert b.state.state == "closed"
    assert b.snapshot()["consecutive_failures"] == 2


def rate_breaker() -> Pinned:
    return Pinned(failure_threshold=100, failure_rate_threshold=0.5, minimum_calls=4, window=10.0)


def test_the_failure_rate_does_not_trip_below_minimum_calls() -> None:
    b = rate_breaker()
    b.fail(3)  # 100 % failures, but only 3 calls
    assert b.state.state == "closed"


def test_the_failure_rate_trips_once_minimum_calls_are_seen() -> None:
    b = rate_breaker()
    b.call(True)
    b.call(True)
    b.call(False)
    change = b.call(False)  # 2 of 4 = 50 %
    assert change.transition == "opened"


def test_a_failure_rate_below_the_threshold_does_not_trip() -> None:
    b = rate_breaker()
    for success in (True, True, True, False, True, False):  # 2 of 6
        b.call(success)
    assert b.state.state == "closed"


@pytest.mark.parametrize(("gap", "trips"), [(5.0, True), (11.0, False)])
def test_the_failure_rate_counts_only_calls_inside_the_window(gap: float, trips: bool) -> None:
    b = rate_breaker()
    b.fail(3)
    b.advance(gap)  # 11 s: the three failures' buckets have left the 10 s window
    b.call(True)
    change = b.call(False)
    assert (change.transition == "opened") is trips


def test_window_counts_forget_old_buckets() -> None:
    b = rate_breaker()
    b.fail(2)
    b.advance(4.0)
    b.call(True)
    assert (b.snapshot()["window_calls"], b.snapshot()["window_failures"]) == (3, 2)
    b.advance(7.0)  # the first two are now 11 s old, the success 7 s
    assert (b.snapshot()["window_calls"], b.snapshot()["window_failures"]) == (1, 0)


# -- open ---------------------------------------------------------------------------------
def test_an_open_breaker_rejects_with_the_time_left() -> None:
    b = Pinned(failure_threshold=1, open_timeout=30.0)
    b.trip()
    b.advance(10.0)
    decision, _ = b.acquire()
    assert decision == Decision(
        allowed=False, kind=None, state="open", retry_after_us=20 * S, transition=None
    )


def test_after_open_timeout_the_next_acquire_half_opens_and_is_a_probe() -> None:
    b = Pinned(failure_threshold=1, open_timeout=30.0)
    b.trip()
    b.advance(29.999999)
    assert not b.acquire()[0].allowed
    b.advance(0.000001)
    decision, _ = b.acquire()
    assert decision == Decision(
        allowed=True, kind="probe", state="half_open", retry_after_us=None, transition="half_opened"
    )


def test_an_open_breaker_past_its_timeout_reads_as_half_open() -> None:
    b = Pinned(failure_threshold=1, open_timeout=30.0)
    b.trip()
    assert b.snapshot()["state"] == "open"
    b.advance(30.0)
    assert b.snapshot()["state"] == "half_open"
    assert b.state.state == "open"  # a snapshot writes nothing


# -- half-open ----------------------------------------------------------------------------
def half_open(**options: Any) -> Pinned:
    b = Pinned(failure_threshold=1, open_timeout=10.0, **options)
    b.trip()
    b.advance(10.0)
    return b


def test_half_open_admits_half_open_max_calls_probes_and_rejects_the_next() -> None:
    b = half_open(half_open_max_calls=2)
    first, _ = b.acquire()
    second, _ = b.acquire()
    third, _ = b.acquire()
    assert (first.kind, first.transition) == ("probe", "half_opened")
    assert (second.kind, second.transition) == ("probe", None)
    assert not third.allowed
    assert (third.state, third.transition) == ("half_open", None)
    assert b.snapshot()["probes_in_flight"] == 2


def test_all_probes_succeeding_closes_the_breaker() -> None:
    b = half_open(half_open_max_calls=2)
    probes = [b.permit(), b.permit()]
    assert b.record(probes[0], True) == Change("half_open", None)
    assert b.record(probes[1], True) == Change("closed", "closed")
    snap = b.snapshot()
    assert (snap["state"], snap["trips"], snap["opened_at"], snap["open_until"]) == (
        "closed",
        0,
        None,
        None,
    )


def test_a_closed_breaker_after_recovery_starts_from_the_base_open_timeout() -> None:
    b = Pinned(failure_threshold=1, open_timeout=10.0, open_timeout_max=100.0)
    b.trip()
    b.advance(10.0)
    b.record(b.permit(), False)  # second trip: 20 s
    b.advance(20.0)
    b.record(b.permit(), True)  # closes
    b.trip()
    assert b.state.open_until_us - b.now == 10 * S


def test_one_failing_probe_reopens_with_the_timeout_doubled_up_to_open_timeout_max() -> None:
    b = Pinned(failure_threshold=1, open_timeout=10.0, open_timeout_max=25.0)
    b.trip()
    timeouts = [b.state.open_until_us - b.now]
    for _ in range(3):
        b.advance(timeouts[-1] / S)
        change = b.record(b.permit(), False)
        assert change == Change("open", "opened")
        timeouts.append(b.state.open_until_us - b.now)
    assert timeouts == [10 * S, 20 * S, 25 * S, 25 * S]


def test_without_open_timeout_max_the_timeout_does_not_grow() -> None:
    b = half_open()
    b.record(b.permit(), False)
    assert b.state.open_until_us - b.now == 10 * S


def test_a_failing_probe_reopens_even_after_another_probe_succeeded() -> None:
    b = half_open(half_open_max_calls=2)
    ok, bad = b.permit(), b.permit()
    b.record(ok, True)
    assert b.record(bad, False) == Change("open", "opened")


def test_a_probe_whose_lease_expired_frees_its_permit() -> None:
    b = half_open(half_open_max_calls=1, probe_lease=5.0)
    lost = b.permit()  # its worker dies
    b.advance(4.9)
    assert not b.acquire()[0].allowed
    b.advance(0.1)
    replacement = b.permit()
    assert replacement[0] == "probe"
    # The lost probe's late answer belongs to nobody any more: it changes nothing.
    assert b.record(lost, False) == Change("half_open", None)
    assert b.record(replacement, True) == Change("closed", "closed")


def test_a_normal_permit_recorded_after_the_breaker_opened_changes_nothing() -> None:
    b = Pinned(failure_threshold=2, open_timeout=30.0)
    straggler = b.permit()
    b.fail(2)
    before = (b.state.opened_at_us, b.state.open_until_us, b.state.trips)
    assert b.record(straggler, False) == Change("open", None)
    assert b.record(straggler, True) == Change("open", None)
    assert (b.state.opened_at_us, b.state.open_until_us, b.state.trips) == before
    assert b.snapshot()["consecutive_failures"] == 0


def test_a_normal_success_recorded_in_half_open_does_not_close_the_breaker() -> None:
    b = Pinned(failure_threshold=1, open_timeout=10.0)
    straggler = b.permit()
    b.trip()
    b.advance(10.0)
    probe = b.permit()
    assert b.record(straggler, True) == Change("half_open", None)
    assert b.snapshot()["probes_in_flight"] == 1
    assert b.record(probe, True).transition == "closed"


# -- operator orders ----------------------------------------------------------------------
def test_forced_open_rejects_without_retry_after_and_never_half_opens() -> None:
    b = Pinned(open_timeout=1.0)
    assert model.force(b.state, "open") == Change("forced_open", "forced_open")
    b.advance(3600.0)
    decision, _ = b.acquire()
    assert decision == Decision(False, None, "forced_open", None, None)


def test_forcing_the_state_it_is_already_in_is_not_a_transition() -> None:
    b = Pinned()
    model.force(b.state, "open")
    assert model.force(b.state, "open") == Change("forced_open", None)
    model.force(b.state, "closed")
    assert model.force(b.state, "closed") == Change("forced_closed", None)


def test_forced_closed_admits_and_no_number_of_failures_trips_it() -> None:
    b = Pinned(failure_threshold=2, failure_rate_threshold=0.1, minimum_calls=1)
    assert model.force(b.state, "closed") == Change("forced_closed", "forced_closed")
    changes = b.fail(20)
    assert {c.transition for c in changes} == {None}
    assert b.state.state == "forced_closed"


def test_forcing_a_half_open_breaker_drops_its_probes() -> None:
    b = half_open(half_open_max_calls=1)
    probe = b.permit()
    model.force(b.state, "open")
    assert b.record(probe, True) == Change("forced_open", None)
    assert b.snapshot()["probes_in_flight"] == 0


def test_reset_returns_a_fresh_closed_breaker_and_keeps_the_totals() -> None:
    b = Pinned(failure_threshold=1)
    b.trip()
    assert model.force(b.state, "reset") == Change("closed", "reset")
    snap = b.snapshot()
    assert snap["state"] == "closed"
    assert (snap["consecutive_failures"], snap["window_calls"], snap["trips"]) == (0, 0, 0)
    assert (snap["opened_at"], snap["open_until"]) == (None, None)
    assert (snap["opened_total"], snap["calls_total"]) == (1, 1)
    assert b.acquire()[0].allowed


def test_reset_ends_forced_open() -> None:
    b = Pinned()
    model.force(b.state, "open")
    model.force(b.state, "reset")
    assert b.acquire()[0].kind == "normal"


# -- maintenance windows ------------------------------------------------------------------
def test_a_window_ends_by_resetting_its_breaker_once_its_time_is_up() -> None:
    b = Pinned()
    until = b.now + 10 * US
    assert model.force(b.state, "open", "w1", until) == Change("forced_open", "forced_open")
    assert b.snapshot()["window"] == "w1"
    assert model.end_window(b.state, b.now, "w1") == Change("forced_open", None)  # not yet
    b.advance(10.0)
    assert model.end_window(b.state, b.now, "w1") == Change("closed", "reset")
    assert b.snapshot()["window"] == ""
    assert model.end_window(b.state, b.now, "w1") == Change("closed", None)  # once


@pytest.mark.parametrize("order", ["open", "closed", "reset"])
def test_every_other_order_drops_the_window_so_its_end_changes_nothing(order: str) -> None:
    b = Pinned()
    model.force(b.state, "open", "w1", b.now + US)
    model.force(b.state, order)  # type: ignore[arg-type]  # a person's lever, no window
    b.advance(2.0)
    state = b.state.state
    assert model.end_window(b.state, b.now, "w1") == Change(state, None)
    assert b.snapshot()["window"] == ""


def test_a_new_window_replaces_the_old_one_whose_end_changes_nothing() -> None:
    b = Pinned()
    model.force(b.state, "open", "w1", b.now + US)
    assert model.force(b.state, "open", "w2", 0) == Change("forced_open", None)  # no end
    b.advance(3600.0)
    assert model.end_window(b.state, b.now, "w1") == Change("forced_open", None)
    assert model.end_window(b.state, b.now, "w2") == Change("forced_open", None)
    assert b.snapshot()["window"] == "w2"


def test_a_window_recorded_without_an_id_ends_a_breaker_no_window_holds() -> None:
    b = Pinned()
    model.force(b.state, "open", "w1", b.now + US)
    b.advance(2.0)
    assert model.end_window(b.state, b.now, "") == Change("forced_open", None)  # w1 holds it
    model.force(b.state, "open")  # as a release before windows held anything
    assert model.end_window(b.state, b.now, "") == Change("closed", "reset")


# -- deferred successes -------------------------------------------------------------------
def test_deferred_successes_count_in_the_window_but_end_no_streak_of_failures() -> None:
    # They may be older than failures other processes recorded meanwhile.
    b = Pinned(failure_threshold=3)
    b.fail(2)
    b.acquire(deferred=1)
    snap = b.snapshot()
    assert (snap["consecutive_failures"], snap["window_calls"]) == (2, 3)
    b.fail(1)
    assert b.state.state == "open"


def test_a_success_recorded_at_once_ends_the_streak() -> None:
    b = Pinned(failure_threshold=3)
    b.fail(2)
    b.record(b.permit(), True)
    b.fail(2)
    assert b.state.state == "closed"


def test_deferred_successes_are_counted_with_the_failure_that_carries_them() -> None:
    b = Pinned(failure_threshold=3)
    b.fail(2)
    change = b.record(b.permit(), False, deferred=2)
    assert change == Change("open", "opened")  # the streak went on: 3 failures
    assert b.state.totals["calls_total"] == 5


def test_deferred_successes_arriving_while_open_count_only_in_the_totals() -> None:
    b = Pinned(failure_threshold=1, open_timeout=30.0)
    b.trip()
    decision, _ = b.acquire(deferred=4)
    assert not decision.allowed
    snap = b.snapshot()
    assert (snap["state"], snap["window_calls"]) == ("open", 0)
    assert snap["successes_total"] == 4


# -- totals -------------------------------------------------------------------------------
def test_totals_count_every_call_rejection_and_transition() -> None:
    b = Pinned(failure_threshold=2, open_timeout=10.0)
    b.call(True)
    b.fail(2)  # opened
    b.acquire()  # rejected
    b.acquire()  # rejected
    b.advance(10.0)
    b.call(True)  # half_opened, closed
    b.acquire(deferred=3)
    totals = {k: v for k, v in b.snapshot().items() if k.endswith("_total")}
    assert totals == {
        "opened_total": 1,
        "half_opened_total": 1,
        "closed_total": 1,
        "calls_total": 7,
        "failures_total": 2,
        "successes_total": 5,
        "rejected_total": 2,
        "bulkhead_rejected_total": 0,
        "retry_budget_refused_total": 0,
        "rate_limited_total": 0,
    }
