"""The drain's pace rules and the gate's decision, as tables: given the state, the time and what a
pass saw or replayed, the next state and how many may go out. No Redis, no clock: the rules are
pure. The store that keeps the state between passes is tested against real Redis in
``test_pace_store.py``."""

from __future__ import annotations

from typing import Any

import pytest

from celery_resilience.drain.gate import (
    BULKHEAD_PATIENCE,
    Gate,
    Look,
    decide,
    half_open_probes,
)
from celery_resilience.drain.pace import (
    FORGET_AFTER,
    STALE,
    BreakerPace,
    PaceSettings,
    PaceState,
    forget,
    full_for,
    refill,
    seconds_for,
    slow_start,
    spend,
)
from celery_resilience.drain.pace_store import decode, encode

pytestmark = pytest.mark.unit

SETTINGS = PaceSettings(rate=10.0, batch=100, slow_start=2)


@pytest.mark.parametrize(
    ("state", "now", "tokens"),
    [
        (None, 50.0, 100.0),  # nothing kept: a full bucket
        (PaceState(0.0, 50.0), 50.0, 0.0),  # no time passed
        (PaceState(0.0, 50.0), 52.5, 25.0),  # 2.5 s at 10/s
        (PaceState(40.0, 50.0), 100.0, 100.0),  # never above the batch
        (PaceState(30.0, 50.0), 40.0, 30.0),  # a clock that went back adds nothing
    ],
)
def test_the_bucket_refills_at_the_rate_up_to_a_batch(
    state: PaceState | None, now: float, tokens: float
) -> None:
    after = refill(state, now, SETTINGS)
    assert after.tokens == pytest.approx(tokens)
    assert after.at == now


@pytest.mark.parametrize(
    ("memory", "trips", "window", "kept"),
    [
        (BreakerPace(), "3", 2, BreakerPace(trips="3", window=2)),  # first pass after a close
        (BreakerPace(trips="3", window=8), "3", 8, BreakerPace(trips="3", window=8)),  # ramping
        (BreakerPace(trips="3", window=8), "4", 2, BreakerPace(trips="4", window=2)),  # new trip
        (BreakerPace(trips="3"), "3", 2, BreakerPace(trips="3", window=2)),  # window lost
    ],
)
def test_the_slow_start_begins_at_its_first_window_after_each_trip(
    memory: BreakerPace, trips: str, window: int, kept: BreakerPace
) -> None:
    assert slow_start(memory, trips, SETTINGS) == (window, kept)


@pytest.mark.parametrize(
    ("tokens", "window", "replayed", "tokens_after", "window_after"),
    [
        (50.0, 4, 4, 46.0, 8),  # the whole window went out: it doubles
        (50.0, 4, 3, 47.0, 4),  # part of it: it stays
        (50.0, 64, 64, 0.0, 100),  # doubles up to a batch (tokens never below 0)
        (50.0, None, 30, 20.0, None),  # no slow start (half-open, no breaker): tokens only
        (2.0, 4, 0, 2.0, 4),  # nothing replayed
    ],
)
def test_a_pass_spends_tokens_and_grows_a_used_window(
    tokens: float, window: int | None, replayed: int, tokens_after: float, window_after: int | None
) -> None:
    memory = BreakerPace(trips="1", window=window)
    state = PaceState(tokens, 10.0, {"b": memory})
    after = spend(state, "b", replayed, window, SETTINGS)
    assert (after.tokens, after.of("b").window) == (tokens_after, window_after)


@pytest.mark.parametrize(
    ("memory", "full", "now", "seconds", "since", "last"),
    [
        (BreakerPace(), False, 10.0, 0.0, None, None),  # a free slot
        (BreakerPace(), True, 10.0, 0.0, 10.0, 10.0),  # first seen full
        (BreakerPace(full_since=10.0, full_last=11.0), True, 12.0, 2.0, 10.0, 12.0),  # stayed
        (BreakerPace(full_since=10.0, full_last=11.0), False, 12.0, 0.0, None, None),  # freed
        # Last seen full too long ago to say it stayed full: counted from now.
        (BreakerPace(full_since=10.0, full_last=11.0), True, 11.0 + STALE + 1, 0.0, 15.0, 15.0),
    ],
)
def test_a_full_bulkhead_counts_from_when_the_passes_first_saw_it_full(
    memory: BreakerPace,
    full: bool,
    now: float,
    seconds: float,
    since: float | None,
    last: float | None,
) -> None:
    held, after = full_for(memory, full, now)
    assert (held, after.full_since, after.full_last) == (seconds, since, last)


def look(state: str, **snapshot: Any) -> Look:
    return Look(
        name="b",
        snapshot={"state": state, "opened_total": 3, **snapshot},
        half_open_max_calls=2,
        probe_lease=30.0,
        max_concurrent_calls=snapshot.pop("limit", None),
        derived=False,
    )


@pytest.mark.parametrize(
    ("seen", "memory", "now", "allowance", "probes"),
    [
        (look("closed"), BreakerPace(), 100.0, None, None),
        (look("forced_closed"), BreakerPace(), 100.0, None, None),
        (look("open", open_until=150.0), BreakerPace(), 100.0, 0, None),
        (look("forced_open"), BreakerPace(), 100.0, 0, None),
        # Half-open: a round of probes, as many as the breaker has free permits.
        (look("half_open", probes_in_flight=0), BreakerPace(), 100.0, 2, (3.0, 100.0)),
        (look("half_open", probes_in_flight=1), BreakerPace(), 100.0, 1, (3.0, 100.0)),
        (look("half_open", probes_in_flight=2), BreakerPace(), 100.0, 0, None),
        # This trip's probes went out 10 s ago: their outcome decides, nothing more goes.
        (look("half_open"), BreakerPace(probes_trip=3.0, probes_at=90.0), 100.0, 0, None),
        # Their lease ended with the breaker still half-open: another round.
        (look("half_open"), BreakerPace(probes_trip=3.0, probes_at=60.0), 100.0, 2, (3.0, 100.0)),
        # Probes of an earlier trip: this half-open's round has not gone yet.
        (look("half_open"), BreakerPace(probes_trip=2.0, probes_at=95.0), 100.0, 2, (3.0, 100.0)),
    ],
)
def test_the_gate_decides_from_one_look_and_the_passes_memory(
    seen: Look,
    memory: BreakerPace,
    now: float,
    allowance: int | None,
    probes: tuple[float, float] | None,
) -> None:
    gate = decide(seen, memory, now, patient=True)
    assert gate.allowance == allowance
    sent = gate.probes_sent
    assert (None if sent is None else (sent.probes_trip, sent.probes_at)) == probes
    if allowance is not None and allowance > 0:
        assert half_open_probes(seen, memory, now)[0] == allowance


@pytest.mark.parametrize(
    ("patient", "since", "allowance"),
    [
        (True, None, None),  # beat: first seen full, a busy recovery looks like this
        (True, 100.0 - BULKHEAD_PATIENCE / 2, None),  # not full for long enough yet
        (True, 100.0 - BULKHEAD_PATIENCE, 0),  # full for the patience: held back
        (False, None, 0),  # a person's drain is held at once
    ],
)
def test_a_bulkhead_that_stays_full_holds_everything_back(
    patient: bool, since: float | None, allowance: int | None
) -> None:
    seen = look("closed", calls_in_flight=4, limit=4)
    memory = BreakerPace() if since is None else BreakerPace(full_since=since, full_last=99.5)
    gate: Gate = decide(seen, memory, 100.0, patient=patient)
    assert gate.allowance == allowance


def test_a_derived_breaker_found_open_is_remembered_until_it_may_half_open() -> None:
    seen = Look("pay:h1", {"state": "open", "open_until": 130.0}, 1, 30.0, None, derived=True)
    assert decide(seen, BreakerPace(), 100.0, patient=True).memory.held_until == 130.0
    closed = Look("pay:h1", {"state": "closed"}, 1, 30.0, None, derived=True)
    memory = BreakerPace(held_until=130.0)
    assert decide(closed, memory, 100.0, patient=True).memory.held_until is None


@pytest.mark.parametrize(
    ("tokens", "count", "seconds"),
    [(100.0, 50, 0.0), (0.0, 50, 5.0), (20.0, 50, 3.0), (0.0, 500, 10.0)],  # at most a batch
)
def test_the_next_pass_comes_when_the_bucket_holds_what_it_wants(
    tokens: float, count: int, seconds: float
) -> None:
    assert seconds_for(PaceState(tokens, 0.0), count, SETTINGS) == pytest.approx(seconds)


def test_forget_drops_derived_breakers_without_entries_and_old_sightings() -> None:
    state = PaceState(
        10.0,
        10_000.0,
        {
            "payments": BreakerPace(trips="1", window=4),  # declared: kept, entries or not
            "web:gone": BreakerPace(trips="1", window=4),  # derived, no entries: forgotten
            "web:here": BreakerPace(held_until=10_005.0),  # derived with entries: kept
            "old": BreakerPace(full_since=1.0, full_last=10_000.0 - FORGET_AFTER - 1),
        },
    )

    def family_of(name: str) -> str | None:
        return name.partition(":")[0] if ":" in name else None

    after = forget(state, {"payments", "web:here", "old"}, family_of)
    assert set(after.breakers) == {"payments", "web:here"}
    assert set(forget(state, None, family_of).breakers) == {"payments", "web:gone", "web:here"}


def test_the_state_reads_back_as_written_in_the_fields_of_the_previous_release() -> None:
    fields = {
        "tokens": "12.5",
        "at": "1000.0",
        "trips|payments": "3",
        "window|payments": "8",
        "full|payments": "990.0|999.0",
        "probes|payments": "3.0|995.0",
        "held|web:h1": "1030.0",
        "window|broken": "not a number",
    }
    state = decode(fields)
    assert state is not None
    assert state.of("payments") == BreakerPace("3", 8, 990.0, 999.0, 3.0, 995.0)
    assert state.of("web:h1").held_until == 1030.0
    assert "broken" not in state.breakers
    assert encode(state) == {k: v for k, v in fields.items() if k != "window|broken"}
    assert decode({}) is None
