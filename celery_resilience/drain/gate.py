"""What a breaker lets one drain pass replay now, and when the next pass should look again.

A pass looks at the breaker once (:func:`look`: one snapshot) and decides from that look and
what the passes remember of it (``pace.py``), without I/O (:func:`decide`): an open breaker
replays nothing, a half-open one a round of probes (:func:`half_open_probes`), a closed one
what the pace allows. A bulkhead that stays full holds everything back, whatever the state.
When a breaker holds due entries back, the look also says when another pass is worth running:
so the drain starts right after the probes close the breaker, not at beat's next tick.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..backout.store import NO_BREAKER
from ..runtime import Runtime
from .pace import BreakerPace, full_for, held, probes_out, probes_sent

#: Shortest wait before the next pass of a drain that has more to send (seconds): each pass is a
#: short task of its own, and this bounds how often one runs.
FOLLOW_UP_MIN = 0.25
#: Wait before the next pass when the replays' queue was full (seconds): the workers are busy.
FOLLOW_UP_BUSY = 0.5
#: Wait before the next pass while a breaker with due entries does not let them through yet
#: (half-open with its probes out, a bulkhead that stayed full): the pass after the probes close
#: the breaker comes within this, not at beat's next tick.
FOLLOW_UP_HELD = 1.0
#: No pass asks for its next one further ahead than this (seconds): the pending pass blocks
#: sooner ones for other breakers until it is due (one is pending at a time), so an open breaker
#: gets a look every 10 s and one when it half-opens.
FOLLOW_UP_MAX = 10.0
#: Seconds a bulkhead must stay full before beat's passes hold replays back. A full bulkhead at
#: one moment is what a busy recovery looks like (the replays that find it full wait in the
#: broker, no attempt spent); one full for longer is a dependency that hangs or is saturated.
BULKHEAD_PATIENCE = 1.0


@dataclass(frozen=True)
class Look:
    """What a pass read of one breaker: its snapshot and the settings the gate decides by."""

    name: str
    snapshot: Mapping[str, Any]
    half_open_max_calls: int
    probe_lease: float
    max_concurrent_calls: int | None
    derived: bool  # named at call time (a member of a family)

    @property
    def state(self) -> str:
        return str(self.snapshot.get("state", "closed"))

    @property
    def trip(self) -> float:
        """The breaker's trip (``opened_total``), which the slow start and the probes follow."""
        try:
            return float(self.snapshot.get("opened_total", 0) or 0)
        except (TypeError, ValueError):
            return 0.0


@dataclass(frozen=True)
class Gate:
    """What a look decided: ``allowance`` (``None``: no gate, 0: none), the breaker's memory
    after the look, and, half-open, the memory to keep once its probes went out."""

    allowance: int | None
    memory: BreakerPace
    probes_sent: BreakerPace | None = None


def look(runtime: Runtime, name: str) -> Look | None:
    """Read breaker ``name`` (one round trip); ``None`` for entries parked under no breaker."""
    if name == NO_BREAKER:
        return None
    breaker = runtime.breaker(name)
    config = breaker.config
    return Look(
        name=name,
        snapshot=breaker.snapshot(),
        half_open_max_calls=config.half_open_max_calls,
        probe_lease=config.probe_lease,
        max_concurrent_calls=config.max_concurrent_calls,
        derived=runtime.config.family_of(name) is not None,
    )


def decide(seen: Look, memory: BreakerPace, now: float, patient: bool) -> Gate:
    """How many entries the breaker lets through now, from the look at it and what the passes
    remember of it (``now``: Redis time). ``patient``: beat's passes, which a bulkhead holds
    back only once it stayed full (:data:`BULKHEAD_PATIENCE`, as the passes saw it); a person's
    drain is held at once."""
    memory = _remember_held(seen, memory, now)
    limit = seen.max_concurrent_calls
    if limit is not None:
        full = int(seen.snapshot.get("calls_in_flight", 0)) >= limit
        if patient:
            held_for_, memory = full_for(memory, full, now)
        else:
            held_for_ = math.inf if full else 0.0
        if held_for_ >= BULKHEAD_PATIENCE:
            return Gate(0, memory)  # the dependency hangs or is saturated: replays would bounce
    if seen.state in ("closed", "forced_closed"):
        return Gate(None, memory)
    if seen.state == "half_open":
        probes, sent = half_open_probes(seen, memory, now)
        return Gate(probes, memory, sent if probes else None)
    return Gate(0, memory)


def half_open_probes(seen: Look, memory: BreakerPace, now: float) -> tuple[int, BreakerPace]:
    """The drain's one decision for a half-open breaker: how many entries go as its probes, and
    the memory to keep once they went out.

    One round per half-open: as many entries as the breaker has free probe permits
    (``half_open_max_calls`` less the probes in flight). Once a pass sent them (the caller keeps
    the returned memory), the passes send nothing more of this trip and let the probes' outcome
    decide: they succeed, the breaker closes and the slow start begins from its first window;
    they fail, it opens again and the entries wait for its next half-open (a new trip, a new
    round). A probe whose worker died is re-leased by the breaker: when the probes' lease
    (``probe_lease``) ends with the breaker still half-open, another round goes.
    """
    if probes_out(memory, seen.trip, now, seen.probe_lease):
        return 0, memory
    free = seen.half_open_max_calls - int(seen.snapshot.get("probes_in_flight", 0))
    return max(0, free), probes_sent(memory, seen.trip, now)


def _remember_held(seen: Look, memory: BreakerPace, now: float) -> BreakerPace:
    """Until when an open breaker named at call time holds its entries (the passes skip it
    meanwhile: :func:`still_held`)."""
    if not seen.derived:
        return memory
    until = seen.snapshot.get("open_until")
    if seen.state == "open" and until and float(until) > now:
        return held(memory, float(until))
    return held(memory, None)


def held_for(snapshot: Mapping[str, Any], now: float) -> float | None:
    """Seconds until a breaker that holds its due entries back may let them through (``now``:
    Redis time): when it half-opens, a short look while its probes or a full bulkhead decide;
    ``None`` while a person holds it open (their ``close`` or ``reset`` ends that; beat's tick
    drains)."""
    state = snapshot.get("state")
    if state == "forced_open":
        return None
    if state == "open" and snapshot.get("open_until"):
        until = float(snapshot["open_until"]) - now
        if until > 0:
            return min(max(FOLLOW_UP_MIN, until), FOLLOW_UP_MAX)
    return FOLLOW_UP_HELD


def still_held(runtime: Runtime, name: str, memory: BreakerPace, now: float) -> float | None:
    """Seconds until a breaker named at call time that a pass found open may replay its
    entries, if it is known to hold them back still (no round trip: its family lists it as
    troubled and its open time has not passed); ``None``: look at it. Declared breakers are
    few: they are always looked at."""
    base = runtime.config.family_of(name)
    until = memory.held_until
    if base is None or until is None or until <= now:
        return None
    if not runtime.knowledge.holds_member(base, name):
        return None  # reset, closed, forgotten, or the family is not known for sure
    return min(max(FOLLOW_UP_MIN, until - now), FOLLOW_UP_MAX)
