"""How much a drain pass may replay: the rate ceiling, the slow start after a breaker closes,
and what the passes remember of each breaker between them. Pure: given the state, the time (Redis
time) and what a pass saw or replayed, the next state and how many may go. The state is kept
fleet-wide between passes by ``pace_store.py``.

- the rate: a token bucket at ``resilience_drain_rate`` per second holding at most
  ``resilience_drain_batch``, a ceiling over every pass, whoever runs it;
- the slow start: a dependency that just came back gets ``resilience_drain_slow_start``
  replays from the first pass after its breaker closed, twice as many from each pass that used
  its whole window, up to ``resilience_drain_batch``. A new trip of the breaker (its
  ``opened_total`` moved) starts the ramp over;
- per breaker, what the gate (``gate.py``) decides from: since when the passes have seen its
  bulkhead full, the trip whose half-open probes a pass sent, and until when a breaker named at
  call time holds its entries back (``held``: the passes skip it meanwhile).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

#: A bulkhead last seen full longer ago than this (seconds) is not known to have stayed full:
#: the passes look at a full bulkhead about every second.
STALE = 3.0
#: Sightings (a full bulkhead, probes sent) older than this (seconds) are forgotten.
FORGET_AFTER = 3600.0


@dataclass(frozen=True)
class PaceSettings:
    """The settings the rules read: ``resilience_drain_rate`` (tokens per second),
    ``resilience_drain_batch`` (the bucket's size and the ramp's top) and
    ``resilience_drain_slow_start`` (the first window after a close)."""

    rate: float
    batch: int
    slow_start: int


@dataclass(frozen=True)
class BreakerPace:
    """What the passes remember of one breaker."""

    #: The trip (``opened_total``) the slow start's window belongs to, and the window.
    trips: str | None = None
    window: int | None = None
    #: The bulkhead: first and last time a pass saw it full.
    full_since: float | None = None
    full_last: float | None = None
    #: The trip whose half-open probes a pass sent, and when.
    probes_trip: float | None = None
    probes_at: float | None = None
    #: A breaker named at call time found open: until when it holds its entries back.
    held_until: float | None = None

    @property
    def empty(self) -> bool:
        return self == BreakerPace()


@dataclass(frozen=True)
class PaceState:
    """The pace between passes: the bucket's tokens as of ``at``, and each breaker's memory."""

    tokens: float
    at: float
    breakers: Mapping[str, BreakerPace] = field(default_factory=dict)

    def of(self, breaker: str) -> BreakerPace:
        return self.breakers.get(breaker, BreakerPace())

    def with_breaker(self, breaker: str, pace: BreakerPace) -> PaceState:
        breakers = dict(self.breakers)
        if pace.empty:
            breakers.pop(breaker, None)
        else:
            breakers[breaker] = pace
        return replace(self, breakers=breakers)


def refill(state: PaceState | None, now: float, settings: PaceSettings) -> PaceState:
    """The state at ``now``: the bucket refilled for the time since ``at`` (full when nothing is
    kept: a first pass, or a day without one)."""
    capacity = float(settings.batch)
    if state is None:
        return PaceState(capacity, now)
    elapsed = max(0.0, now - state.at)
    return replace(state, tokens=min(capacity, state.tokens + elapsed * settings.rate), at=now)


def slow_start(pace: BreakerPace, trips: str, settings: PaceSettings) -> tuple[int, BreakerPace]:
    """The slow start's window for a closed breaker in this pass (``trips``: its
    ``opened_total``): the first window again when it tripped since the ramp began."""
    start = min(settings.slow_start, settings.batch)
    if pace.trips != trips or pace.window is None:
        return start, replace(pace, trips=trips, window=start)
    return pace.window, pace


def spend(
    state: PaceState,
    breaker: str,
    replayed: int,
    window: int | None,
    settings: PaceSettings,
) -> PaceState:
    """The state after a pass replayed ``replayed`` entries of ``breaker``: tokens spent, and a
    slow start (``window``: the window it had) whose whole window went out doubled."""
    state = replace(state, tokens=max(0.0, state.tokens - replayed))
    if window is not None and replayed >= window:
        grown = min(window * 2, settings.batch)
        state = state.with_breaker(breaker, replace(state.of(breaker), window=grown))
    return state


def full_for(pace: BreakerPace, full: bool, now: float) -> tuple[float, BreakerPace]:
    """Seconds the bulkhead has been full as the passes saw it, and the memory after this
    sighting: 0 when this pass sees a free slot, is the first to see it full, or the last
    sighting is too old to say it stayed full since (:data:`STALE`)."""
    if not full:
        return 0.0, replace(pace, full_since=None, full_last=None)
    since, last = pace.full_since, pace.full_last
    if since is None or last is None or now - last > STALE:
        since = now
    return max(0.0, now - since), replace(pace, full_since=since, full_last=now)


def probes_out(pace: BreakerPace, trip: float, now: float, lease: float) -> bool:
    """Whether a pass sent this half-open's probes (same trip, within the probes' ``lease``)."""
    return pace.probes_trip == trip and pace.probes_at is not None and now - pace.probes_at < lease


def probes_sent(pace: BreakerPace, trip: float, now: float) -> BreakerPace:
    return replace(pace, probes_trip=trip, probes_at=now)


def held(pace: BreakerPace, until: float | None) -> BreakerPace:
    """The memory of a breaker named at call time that holds its entries back until ``until``
    (``None``: it no longer does)."""
    return replace(pace, held_until=until)


def seconds_for(state: PaceState, count: int, settings: PaceSettings) -> float:
    """Seconds until the bucket holds ``count`` tokens again (0 when it does)."""
    missing = min(count, settings.batch) - state.tokens
    return max(0.0, missing / settings.rate)


def forget(
    state: PaceState,
    live: set[str] | None,
    family_of: Callable[[str], str | None],
) -> PaceState:
    """The state without what no pass needs any more: sightings older than
    :data:`FORGET_AFTER`, and, when ``live`` names the breakers with parked entries, all that is
    kept of breakers named at call time outside it (thousands of hosts come and go; a declared
    breaker's ramp is kept, its backlog may be empty for a moment)."""
    now = state.at
    breakers: dict[str, BreakerPace] = {}
    for name, kept in state.breakers.items():
        if live is not None and name not in live and family_of(name) is not None:
            continue
        pace = kept
        if pace.full_last is not None and now - pace.full_last > FORGET_AFTER:
            pace = replace(pace, full_since=None, full_last=None)
        if pace.probes_at is not None and now - pace.probes_at > FORGET_AFTER:
            pace = replace(pace, probes_trip=None, probes_at=None)
        if not pace.empty:
            breakers[name] = pace
    return replace(state, breakers=breakers)


class TokenBucket:
    """``rate`` tokens per second, at most ``capacity`` saved up, in the process: a person's
    drain (``Drainer.run``), which may wait for them."""

    def __init__(self, rate: float, capacity: float) -> None:
        self.rate, self.capacity = rate, max(capacity, 1.0)
        self.tokens = self.capacity
        self._last = time.monotonic()

    def take(self, n: int) -> None:
        """Block until ``n`` tokens are there, then spend them."""
        while True:
            now = time.monotonic()
            self.tokens = min(self.capacity, self.tokens + (now - self._last) * self.rate)
            self._last = now
            if self.tokens >= n or self.tokens >= self.capacity:
                self.tokens -= n
                return
            time.sleep((min(n, self.capacity) - self.tokens) / self.rate)
