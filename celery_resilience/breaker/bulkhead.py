"""The bulkhead's part of the pure model: at most ``max_concurrent_calls`` calls in flight.

With the bulkhead on (``Limits.max_concurrent_calls`` > 0), every permit, normal or probe, also
takes one of that many slots, each under a lease of ``call_lease``; a call that finds them all
taken is rejected (``Decision.full``) without touching the breaker's judgement. The outcome or a
release frees the slot; a lease that ran out (a killed or hung holder) is cleared by the next
acquire. No transition frees slots: the calls they stand for are still in flight. The Lua twin
is in ``lua/acquire.lua`` (taking) and ``lua/record.lua`` / ``lua/release_permit.lua`` (freeing).
"""

from __future__ import annotations

from .types import BreakerState, Decision, Limits, Transition


def take_slot(s: BreakerState, lim: Limits, now: int, permit_id: str) -> bool:
    """A slot for this permit: always when the bulkhead is off, else if one is free."""
    if lim.max_concurrent_calls <= 0:
        return True
    for pid in [p for p, expiry in s.calls.items() if expiry <= now]:
        del s.calls[pid]
    if len(s.calls) >= lim.max_concurrent_calls:
        return False
    s.calls[permit_id] = now + lim.call_lease_us
    return True


def full(s: BreakerState, transition: Transition | None) -> Decision:
    """The rejection of a call that found every slot taken (counted apart from the others)."""
    s.totals["rejected_total"] += 1
    s.totals["bulkhead_rejected_total"] += 1
    return Decision(False, None, s.state, None, transition, full=True)


def free_slot(s: BreakerState, permit_id: str) -> None:
    """The call ended (judged or not): its slot, if it held one, is free at once."""
    s.calls.pop(permit_id, None)


def in_flight(s: BreakerState, now: int) -> int:
    """Slots held under a lease that has not run out."""
    return sum(1 for expiry in s.calls.values() if expiry > now)
