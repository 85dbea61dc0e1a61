"""The breaker's pure state machine: the specification the Lua scripts must match.

No I/O and no clock of its own: every operation takes ``now`` in integer microseconds, so the
Redis scripts (Lua numbers are doubles, exact for integers below 2**53) and this module compute
the same decisions bit for bit. A Hypothesis stateful test holds them together.

States: ``closed`` -> (``failure_threshold`` consecutive failures, or a failure rate of at least
``failure_rate_threshold`` over ``window`` once ``minimum_calls`` were seen) -> ``open`` ->
(``open_timeout``, doubling on each repeated trip up to ``open_timeout_max``) -> ``half_open``,
which admits ``half_open_max_calls`` probes, each under a lease of ``probe_lease``: all of them
succeeding closes the breaker, any failing reopens it. ``forced_open`` and ``forced_closed`` hold
until ``reset``. The bulkhead (``max_concurrent_calls``, leased slots) is in ``bulkhead.py``.

Permits: a call admitted while closed is a ``normal`` permit; in half-open it is a ``probe``
identified by a permit id. A normal permit recorded after the breaker opened changes no state: it
describes a dependency the breaker has already judged. A probe counts while its permit is still
listed: leases that ran out are cleared by the next acquire (which may hand the slot to a new
probe); until then a late result of the old probe still decides, as it is real evidence.

The data these transitions read and write (states, ``Limits``, ``BreakerState``, the answers and
the cached ``view``) is in ``types.py``, so the stores and the facade speak it without this module.
Each public operation runs its private twin through ``_observed``, which bumps ``version`` when
the view changed.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal, TypeVar

from . import bulkhead
from .types import (
    BUCKETS,
    US,
    Action,
    BreakerState,
    Change,
    Decision,
    Kind,
    Limits,
    State,
    Transition,
    view,
)

#: Growth of the open timeout stops doubling after this many repeated trips (overflow guard).
MAX_GROWTH_EXPONENT = 40

R = TypeVar("R", Decision, Change)


def _observed(s: BreakerState, before: tuple[State, bool], result: R) -> R:
    after = view(s)
    if after != before:
        s.version += 1
    return dataclasses.replace(result, version=s.version, streak=after[1])


def window_counts(s: BreakerState, lim: Limits, now: int) -> tuple[int, int]:
    """Calls and failures in the buckets that still lie inside the window at ``now``."""
    current = now // lim.bucket_us
    calls = failures = 0
    for slot in range(BUCKETS):
        if s.bucket_epoch[slot] > current - BUCKETS:
            calls += s.bucket_calls[slot]
            failures += s.bucket_failures[slot]
    return calls, failures


def window_retries(s: BreakerState, lim: Limits, now: int) -> int:
    """Retries the budget granted in the buckets that still lie inside the window at ``now``."""
    current = now // lim.bucket_us
    return sum(
        s.bucket_retries[slot]
        for slot in range(BUCKETS)
        if s.bucket_epoch[slot] > current - BUCKETS
    )


def _add_to_window(
    s: BreakerState, lim: Limits, now: int, calls: int, failures: int, retries: int = 0
) -> None:
    epoch = now // lim.bucket_us
    slot = epoch % BUCKETS
    if s.bucket_epoch[slot] != epoch:
        s.bucket_epoch[slot], s.bucket_calls[slot], s.bucket_failures[slot] = epoch, 0, 0
        s.bucket_retries[slot] = 0
    s.bucket_calls[slot] += calls
    s.bucket_failures[slot] += failures
    s.bucket_retries[slot] += retries


def _clear_counts(s: BreakerState) -> None:
    s.consecutive_failures = 0
    s.half_open_successes = 0
    s.probes.clear()
    s.bucket_epoch[:] = [-1] * BUCKETS
    s.bucket_calls[:] = [0] * BUCKETS
    s.bucket_failures[:] = [0] * BUCKETS
    s.bucket_retries[:] = [0] * BUCKETS


def _trip(s: BreakerState, lim: Limits, now: int, least_open_us: int = 0) -> Transition:
    s.trips += 1
    growth = 2 ** min(s.trips - 1, MAX_GROWTH_EXPONENT)
    # A failure that said when to come back (Retry-After) keeps the breaker open that long.
    timeout = max(least_open_us, min(lim.open_timeout_max_us, lim.open_timeout_us * growth))
    _clear_counts(s)
    s.state, s.opened_at_us, s.open_until_us = "open", now, now + timeout
    s.totals["opened_total"] += 1
    return "opened"


def _close(s: BreakerState) -> Transition:
    _clear_counts(s)
    s.state, s.trips, s.opened_at_us, s.open_until_us = "closed", 0, 0, 0
    s.totals["closed_total"] += 1
    return "closed"


def _count(s: BreakerState, calls: int, failures: int) -> None:
    s.totals["calls_total"] += calls
    s.totals["failures_total"] += failures
    s.totals["successes_total"] += calls - failures


def _acquire(
    s: BreakerState, lim: Limits, now: int, permit_id: str, deferred_successes: int = 0
) -> Decision:
    apply_deferred(s, lim, now, deferred_successes)
    transition: Transition | None = None
    if s.state in ("closed", "forced_closed"):
        if bulkhead.take_slot(s, lim, now, permit_id):
            return Decision(True, "normal", s.state, None, None)
        return bulkhead.full(s, None)
    if s.state == "forced_open":
        s.totals["rejected_total"] += 1
        return Decision(False, None, s.state, None, None)
    if s.state == "open":
        if now < s.open_until_us:
            s.totals["rejected_total"] += 1
            return Decision(False, None, s.state, s.open_until_us - now, None)
        s.state, s.half_open_successes = "half_open", 0
        s.probes.clear()
        s.totals["half_opened_total"] += 1
        transition = "half_opened"

    # half-open: a probe whose lease ran out belongs to a process that died or hangs.
    for pid in [p for p, expiry in s.probes.items() if expiry <= now]:
        del s.probes[pid]
    if len(s.probes) < lim.half_open_max_calls:
        if not bulkhead.take_slot(s, lim, now, permit_id):
            return bulkhead.full(s, transition)
        s.probes[permit_id] = now + lim.probe_lease_us
        return Decision(True, "probe", s.state, None, transition)
    s.totals["rejected_total"] += 1
    return Decision(False, None, s.state, lim.open_timeout_us, transition)


def apply_deferred(s: BreakerState, lim: Limits, now: int, successes: int) -> None:
    """Successes of normal permits that a process held back to save round trips.

    They count in the window and the totals but do not end a streak of failures: they happened
    before this moment, possibly before failures other processes recorded meanwhile. A success
    recorded at once (a probe, or the one a process sends each ``FLUSH_INTERVAL``) does.
    """
    if successes > 0:
        _count(s, successes, 0)
        if s.state in ("closed", "forced_closed"):
            _add_to_window(s, lim, now, successes, 0)


def _record(
    s: BreakerState,
    lim: Limits,
    now: int,
    kind: Kind,
    permit_id: str,
    success: bool,
    deferred_successes: int = 0,
    least_open_us: int = 0,
) -> Change:
    apply_deferred(s, lim, now, deferred_successes)
    _count(s, 1, 0 if success else 1)
    bulkhead.free_slot(s, permit_id)
    if kind == "lost":
        kind = "probe" if permit_id in s.probes else "normal"
    if kind == "probe":
        if s.state != "half_open" or permit_id not in s.probes:
            return Change(s.state, None)
        del s.probes[permit_id]
        transition: Transition | None = None
        if not success:
            transition = _trip(s, lim, now, least_open_us)
        else:
            s.half_open_successes += 1
            if s.half_open_successes >= lim.half_open_max_calls:
                transition = _close(s)
        return Change(s.state, transition)

    if s.state not in ("closed", "forced_closed"):
        return Change(s.state, None)
    _add_to_window(s, lim, now, 1, 0 if success else 1)
    if success:
        s.consecutive_failures = 0
        return Change(s.state, None)
    s.consecutive_failures += 1
    if s.state == "closed" and _should_trip(s, lim, now):
        tripped = _trip(s, lim, now, least_open_us)
        return Change(s.state, tripped)
    return Change(s.state, None)


def _release(
    s: BreakerState, lim: Limits, now: int, kind: Kind, permit_id: str, deferred: int = 0
) -> Change:
    apply_deferred(s, lim, now, deferred)
    bulkhead.free_slot(s, permit_id)
    if kind == "probe" and s.state == "half_open":
        s.probes.pop(permit_id, None)
    return Change(s.state, None)


def acquire(
    s: BreakerState, lim: Limits, now: int, permit_id: str, deferred_successes: int = 0
) -> Decision:
    """Ask for a permit; ``deferred_successes`` are normal successes recorded first."""
    before = view(s)
    return _observed(s, before, _acquire(s, lim, now, permit_id, deferred_successes))


def record(
    s: BreakerState,
    lim: Limits,
    now: int,
    kind: Kind,
    permit_id: str,
    success: bool,
    deferred_successes: int = 0,
    least_open_us: int = 0,
) -> Change:
    """Record the outcome of a permitted call, after this process's deferred successes; a
    failure that trips the breaker keeps it open at least ``least_open_us``."""
    before = view(s)
    change = _record(s, lim, now, kind, permit_id, success, deferred_successes, least_open_us)
    return _observed(s, before, change)


def retry_budget(lim: Limits, ratio: float, floor: float, calls: int, retries: int) -> int:
    """How many retries the budget still grants: ``ratio`` of the window's first attempts (its
    calls less the retries granted) plus ``floor`` retries a second over the window, less the
    retries already granted. Calls reach the window up to a flush late, so first attempts are
    never overcounted: the promise ``retries <= ratio * first attempts + floor * window``
    holds."""
    window_s = lim.window_us / US
    allowed = ratio * max(0, calls - retries) + floor * window_s
    return max(0, math.floor(allowed - retries))


def spend_retries(
    s: BreakerState, lim: Limits, now: int, ratio: float, floor: float, wanted: int
) -> int:
    """Take up to ``wanted`` retries from the breaker's retry budget; how many it granted.

    Only a closed breaker (or one forced closed) spends: elsewhere a retry is not admitted to
    the dependency anyway (the admission turns it away or makes it a probe), so all are
    granted and none counted. Retries refused add to ``retry_budget_refused_total``."""
    if s.state not in ("closed", "forced_closed") or wanted <= 0:
        return max(0, wanted)
    calls, _ = window_counts(s, lim, now)
    granted = min(wanted, retry_budget(lim, ratio, floor, calls, window_retries(s, lim, now)))
    if granted:
        _add_to_window(s, lim, now, 0, 0, granted)
    s.totals["retry_budget_refused_total"] += wanted - granted
    return granted


def lease_rate(s: BreakerState, now: int, span_us: int, burst_us: int, refused: int = 0) -> int:
    """Lease one batch of calls from the breaker's fleet-wide ``rate_limit`` (a GCRA): 0 when
    granted, else the microseconds until it would be (> 0).

    ``span_us`` is the time the fleet's rate takes to earn the batch; ``burst_us`` how far ahead
    of ``now`` the rate may be spent (the bucket's size, as time). The theoretical arrival time
    only moves on a grant, so a refusal costs the fleet nothing. ``refused``: calls a process
    turned away alone since its last lease, added to ``rate_limited_total``."""
    tat = max(s.rate_tat_us, now)
    wait = tat + span_us - burst_us - now
    if wait <= 0:
        s.rate_tat_us = tat + span_us
    s.totals["rate_limited_total"] += refused
    return max(0, wait)


def release(
    s: BreakerState,
    lim: Limits,
    now: int,
    kind: Kind,
    permit_id: str,
    deferred_successes: int = 0,
) -> Change:
    """Give a permit back unjudged (the call ended in the caller's own error): nothing is counted,
    and a probe's slot is freed at once instead of when its lease runs out."""
    before = view(s)
    return _observed(s, before, _release(s, lim, now, kind, permit_id, deferred_successes))


def force(
    s: BreakerState, action: Action, window: str = "", until_us: int = 0, now: int = 0
) -> Change:
    """An operator's order: hold open, hold closed, or reset to a fresh closed breaker.

    ``window``: the maintenance window that holds it open (``open`` only), ending at
    ``until_us`` (0: not by itself), set at ``now``. Every order drops the window held
    before."""
    before = view(s)
    change = _force(s, action)
    if action == "open" and window:
        s.window, s.window_until_us, s.window_at_us = window, until_us, now
    else:
        s.window, s.window_until_us, s.window_at_us = "", 0, 0
    return _observed(s, before, change)


def end_window(s: BreakerState, now: int, window: str, recorded_us: int = 0) -> Change:
    """Maintenance window ``window`` is over: reset the breaker, only if that very window
    still holds it forced open and has ended by ``now`` (an order given since dropped it).
    ``window`` ``""`` names a window recorded without an id, at ``recorded_us``, by the previous
    release, whose orders know no hold and leave one behind: the breaker is reset if it is
    forced open and no window set after that record holds it."""
    if window:
        ours = s.window == window and 0 < s.window_until_us <= now
    else:
        ours = not s.window or s.window_at_us < recorded_us
    if s.state != "forced_open" or not ours:
        return _observed(s, view(s), Change(s.state, None))
    return force(s, "reset")


def skip(s: BreakerState, lim: Limits, now: int, deferred_successes: int = 0) -> Decision:
    """A delivery skipped before any permit (``deduplicate``, a redelivery past the limit):
    only this process's deferred successes are recorded."""
    before = view(s)
    apply_deferred(s, lim, now, deferred_successes)
    return _observed(s, before, Decision(False, None, s.state, None, None))


def _should_trip(s: BreakerState, lim: Limits, now: int) -> bool:
    if s.consecutive_failures >= lim.failure_threshold:
        return True
    if lim.failure_rate_threshold <= 0:
        return False
    calls, failures = window_counts(s, lim, now)
    return calls >= lim.minimum_calls and failures / calls >= lim.failure_rate_threshold


def _force(s: BreakerState, action: Action) -> Change:
    if action == "reset":
        _clear_counts(s)
        s.state, s.trips, s.opened_at_us, s.open_until_us = "closed", 0, 0, 0
        return Change(s.state, "reset")
    target: Literal["forced_open", "forced_closed"] = (
        "forced_open" if action == "open" else "forced_closed"
    )
    if s.state == target:
        return Change(s.state, None)
    s.probes.clear()
    s.half_open_successes = 0
    s.state = target
    return Change(s.state, target)


def snapshot(s: BreakerState, lim: Limits, now: int) -> dict[str, object]:
    """A read-only view; an open breaker whose timeout has passed reads as ``half_open``."""
    calls, failures = window_counts(s, lim, now)
    state: State = s.state
    if state == "open" and now >= s.open_until_us:
        state = "half_open"
    live = sum(1 for expiry in s.probes.values() if expiry > now)
    return {
        "state": state,
        "consecutive_failures": s.consecutive_failures,
        "window_calls": calls,
        "window_failures": failures,
        "opened_at": s.opened_at_us / US if s.opened_at_us else None,
        "open_until": s.open_until_us / US if s.open_until_us else None,
        "trips": s.trips,
        "half_open_successes": s.half_open_successes,
        "probes_in_flight": live if s.state == "half_open" else 0,
        "calls_in_flight": bulkhead.in_flight(s, now),
        "window_retries": window_retries(s, lim, now),
        **s.totals,
        "window": s.window,
    }
