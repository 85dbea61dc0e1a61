"""One pass of the drain (beat's ``celery_resilience.drain`` task, ``Drainer.drain_once``): what
the breakers and the pace allow now, replayed, then return, never waiting (a worker's pool slot
is never held idle).

What is allowed: per breaker, what one look at it lets through (``gate.py``), room in the
replay's queue (``queue_room.py``), the slow start after a close and the rate ceiling
(``pace.py``, kept between passes by ``pace_store.py``: read once at the pass's start, written
once at its end). The report says when another pass has work (``next_in``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..runtime import Runtime
from .batch import BatchPublisher
from .gate import FOLLOW_UP_BUSY, FOLLOW_UP_MIN, decide, held_for, look, still_held
from .pace import PaceSettings, PaceState, forget, refill, seconds_for, slow_start, spend
from .pace_store import PaceStore
from .queue_room import QueueRoom
from .report import DrainReport, left_due, tally


@dataclass(frozen=True)
class BreakerPass:
    """What one pass did with one breaker: ``replayed`` entries; ``more``: how many the next
    pass would send if the rate allowed; ``wait``: seconds until the breaker may replay what it
    holds back (``None`` when it holds nothing back)."""

    replayed: int
    more: int
    wait: float | None


class DrainPass:
    """One pass over breakers, under the drain's lock (held by the caller)."""

    def __init__(
        self, runtime: Runtime, batches: BatchPublisher, lease: float, report: DrainReport
    ) -> None:
        self.runtime = runtime
        self.config = runtime.config
        self.store = runtime.backout_store
        self.batches = batches
        self.lease = lease
        self.report = report
        self.settings = PaceSettings(
            self.config.drain_rate, self.config.drain_batch, self.config.drain_slow_start
        )

    def run(self, names: list[str], every: bool, limit: int | None) -> None:
        """Release what breakers ``names`` allow now (``every``: they are all the breakers with
        parked entries, so the pace may forget the others)."""
        report = self.report
        pace_store = PaceStore(self.runtime)
        now = self.runtime.now()
        state = refill(pace_store.load(), now, self.settings)
        room = QueueRoom(self.runtime)
        wanted, busy, budget = 0, False, limit
        waits: list[float] = []  # when each breaker wants its next pass
        state = forget(state, set(names) if every else None, self.config.family_of)
        self._know_families(names)
        for name in names:
            if budget is not None and budget <= 0:
                break
            held = still_held(self.runtime, name, state.of(name), now)
            if held is not None:  # an open host among thousands: no round trip
                waits.append(held)
                continue
            state, done = self._breaker(name, budget, state, now, room)
            budget = None if budget is None else budget - done.replayed
            wanted = max(wanted, done.more)
            busy = busy or (done.more > 0 and room.was_full())
            if done.wait is not None:
                waits.append(done.wait)
        pace_store.save(state)
        if room.unreadable:
            report.errors += 1
            return
        if wanted:  # the next pass when the bucket holds what it will want
            wait = max(FOLLOW_UP_MIN, seconds_for(state, wanted, self.settings))
            waits.append(max(wait, FOLLOW_UP_BUSY) if busy else wait)
        if waits:
            report.next_in = min(waits)

    def _know_families(self, names: list[str]) -> None:
        """Refresh what this process knows of each family with entries (a round trip each, at
        most twice a second): it tells which of its open members still hold."""
        bases = {self.config.family_of(name) for name in names} - {None}
        for base in sorted(b for b in bases if b is not None):
            if self.runtime.knowledge.family_due(base):
                self.runtime.refresh_family(base)

    def _breaker(
        self, name: str, budget: int | None, state: PaceState, now: float, room: QueueRoom
    ) -> tuple[PaceState, BreakerPass]:
        """Release what breaker ``name`` allows in this pass; the pace after it, and what the
        breaker asks of the next pass."""
        seen = look(self.runtime, name)
        gate = decide(seen, state.of(name), now, patient=True) if seen is not None else None
        allowance = None if gate is None else gate.allowance
        memory = state.of(name) if gate is None else gate.memory
        due = self.store.due(name, now)
        window = None
        if due and allowance is None and seen is not None:  # closed: the slow start
            trips = str(seen.snapshot.get("opened_total", 0))
            window, memory = slow_start(memory, trips, self.settings)
        state = state.with_breaker(name, memory)
        caps = [self.config.drain_batch, due, window, budget]
        unpaced = min(c for c in caps if c is not None)
        want = min(c for c in (unpaced, int(state.tokens), allowance) if c is not None)
        replayed = 0
        if want > 0:  # claimed first: which queue an entry goes to is in the entry
            claimed = self.store.claim(name, want, self.lease)
            if claimed:
                outcome = self.batches.publish(name, claimed, room, now)
                tally(self.report, name, outcome)
                replayed = outcome.published
        state = spend(state, name, replayed, window, self.settings)
        if replayed and gate is not None and gate.probes_sent is not None:
            sent = gate.probes_sent
            probes = replace(state.of(name), probes_trip=sent.probes_trip, probes_at=sent.probes_at)
            state = state.with_breaker(name, probes)
        left = self.store.due(name, now)
        left_due(self.report, name, left)
        if allowance is None:
            return state, BreakerPass(replayed, min(left, unpaced), None)
        # Open, half-open or a full bulkhead: the breaker decides when the rest may go.
        assert seen is not None
        return state, BreakerPass(replayed, 0, held_for(seen.snapshot, now) if left else None)
