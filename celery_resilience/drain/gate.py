"""What a breaker lets one drain pass release now, and when the next pass should look again.

A pass asks the breaker first (``Drainer``): an open one releases nothing, a half-open one no
more than its free probe permits, a closed one what the pace allows. A bulkhead that stays full
holds everything back, whatever the state. When a breaker holds due entries back, it also says
when another pass is worth running: so the drain starts right after the probes close the
breaker, not at beat's next tick.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..backout.store import NO_BREAKER
from ..runtime import Runtime
from .pace import DrainPace

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


def gate(
    runtime: Runtime, name: str, pace: DrainPace | None = None
) -> tuple[int | None, Mapping[str, Any]]:
    """How many entries the breaker lets through now (``None`` = no gate, 0 = none), and
    the snapshot that says so. ``pace``: beat's pass, which a bulkhead holds back only once it
    stayed full (:data:`BULKHEAD_PATIENCE`) and which sends one round of probes per half-open
    (until the breaker moves or the probes' lease ends); a person's drain is held at once."""
    if name == NO_BREAKER:
        return None, {}
    breaker = runtime.breaker(name)
    snap = breaker.snapshot()
    state = snap["state"]
    limit = breaker.config.max_concurrent_calls
    if limit is not None:
        full = int(snap["calls_in_flight"]) >= limit
        held = pace.full_for(name, full) if pace is not None else (math.inf if full else 0)
        if held >= BULKHEAD_PATIENCE:
            return 0, snap  # the dependency hangs or is saturated: replays would bounce
    if state in ("closed", "forced_closed"):
        return None, snap
    if state == "half_open":
        if pace is not None and pace.probes_out(name, snap, breaker.config.probe_lease):
            return 0, snap  # this half-open's probes were sent: their outcome decides
        free = breaker.config.half_open_max_calls - int(snap["probes_in_flight"])
        return max(0, free), snap
    return 0, snap


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


def still_held(runtime: Runtime, name: str, pace: DrainPace) -> float | None:
    """Seconds until a breaker named at call time that a pass found open may release its
    entries, if it is known to hold them back still (no round trip: its family lists it as
    troubled and its open time has not passed); ``None``: look at it. Declared breakers are
    few: they are always looked at."""
    base = runtime.config.family_of(name)
    until = pace.held_until(name)
    if base is None or until is None or until <= pace.now:
        return None
    if not runtime.knowledge.holds_member(base, name):
        return None  # reset, closed, forgotten, or the family is not known for sure
    return min(max(FOLLOW_UP_MIN, until - pace.now), FOLLOW_UP_MAX)


def remember_held(
    runtime: Runtime, name: str, snapshot: Mapping[str, Any], pace: DrainPace
) -> None:
    """After a look at breaker ``name``: remember until when an open derived breaker holds."""
    if runtime.config.family_of(name) is None:
        return
    until = snapshot.get("open_until")
    if snapshot.get("state") == "open" and until and float(until) > pace.now:
        pace.hold(name, float(until))
    else:
        pace.hold(name, None)
