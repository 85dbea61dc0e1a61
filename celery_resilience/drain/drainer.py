"""The drain run: bringing parked work back (claim under a lease, publish, ack).

At-least-once: an entry is removed only after its publish returned; a drainer that dies leaves
its claimed entries to come due again when their lease ends (duplicates: at most one batch).
One drainer at a time (``lock.py``), the lock renewed after every batch.
Gating (``gate.py``): a breaker that is open releases nothing, a half-open one no more
than its free probe permits, a closed one what the pace allows; a bulkhead that stays full
releases nothing, whatever the state.

Each claimed batch goes to ``batch.py``, which checks, publishes and settles it.

Two ways to run it:

- :meth:`Drainer.step`, beat's ``celery_resilience.drain`` task: one pass that releases what is
  allowed *now* and returns, never waiting (a worker's pool slot is never held idle). What is
  allowed: room in the replay's queue (``queue_room.py``), the slow start after a close and the
  rate ceiling (``pace.py``). Its report says when another pass has work (``next_in``).
- :meth:`Drainer.run`, a person's ``celery resilience drain``: everything due now, in batches of
  ``resilience_drain_batch`` paced at ``resilience_drain_rate``, waiting between them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis

from ..backout.entry import ParkedTask
from ..backout.store import NO_BREAKER, BackoutStore
from ..errors import StoreUnavailable
from ..redact import get_logger
from ..runtime import Runtime
from .batch import BatchPublisher
from .gate import (
    FOLLOW_UP_BUSY,
    FOLLOW_UP_MIN,
    gate,
    held_for,
    remember_held,
    still_held,
)
from .lock import drain_lock
from .pace import DrainPace, TokenBucket
from .queue_room import QueueRoom
from .report import DrainReport, counters
from .status import mark_drained

logger = get_logger("celery_resilience.drain")

#: Seconds a claimed entry stays with the drainer before it is due again.
DEFAULT_LEASE = 60.0


class Drainer:
    """One drain run over the breakers asked for (all that have parked entries by default)."""

    def __init__(
        self,
        runtime: Runtime,
        lease: float = DEFAULT_LEASE,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        self.runtime = runtime
        #: Told after each batch how many entries it finished (replayed or dead): a CLI's bar.
        self.progress = progress
        self.store: BackoutStore = runtime.backout_store
        self.config = runtime.config
        self.lease = lease
        self.batches = BatchPublisher(runtime)

    def run(self, breaker: str | None = None, limit: int | None = None) -> DrainReport:
        """Everything due now, in batches paced at ``resilience_drain_rate`` (it waits)."""
        bucket = TokenBucket(self.config.drain_rate, self.config.drain_batch)
        # Renewed after every batch; the next one may first wait drain_batch / drain_rate for
        # its tokens, and must then still be published within the lease.
        lock_ttl = self.lease + self.config.drain_batch / self.config.drain_rate

        def body(lock: Any, report: DrainReport) -> None:
            budget = limit
            for name in self._names(breaker, report):
                if budget is not None and budget <= 0:
                    break
                released = self._drain_breaker(name, budget, lock, bucket, report)
                budget = None if budget is None else budget - released

        return self._under_lock(lock_ttl, body)

    def step(self, breaker: str | None = None, limit: int | None = None) -> DrainReport:
        """What is allowed now, then return (beat's task): never waits for anything."""

        def body(lock: Any, report: DrainReport) -> None:
            pace = DrainPace(self.runtime)
            room = QueueRoom(self.runtime)
            wanted, busy, budget = 0, False, limit
            waits: list[float] = []  # when each breaker wants its next pass
            names = self._names(breaker, report)
            if breaker is None:
                pace.forget_others(set(names))
            self._know_families(names)
            for name in names:
                if budget is not None and budget <= 0:
                    break
                held = still_held(self.runtime, name, pace)
                if held is not None:  # an open host among thousands: no round trip
                    waits.append(held)
                    continue
                released, more, wait = self._step_breaker(name, budget, pace, room, report)
                budget = None if budget is None else budget - released
                wanted = max(wanted, more)
                busy = busy or (more > 0 and room.was_full())
                if wait is not None:
                    waits.append(wait)
            pace.save()
            if room.unreadable:
                report.errors += 1
                return
            if wanted:  # the next pass when the bucket holds what it will want
                wait = max(FOLLOW_UP_MIN, pace.seconds_for(wanted))
                waits.append(max(wait, FOLLOW_UP_BUSY) if busy else wait)
            if waits:
                report.next_in = min(waits)

        return self._under_lock(self.lease, body)

    # -- the two runs' shared frame ----------------------------------------------------------
    def _under_lock(self, lock_ttl: float, body: Callable[[Any, DrainReport], None]) -> DrainReport:
        started = time.monotonic()
        report = DrainReport()
        try:
            with drain_lock(self.runtime, lock_ttl) as lock:
                if lock is None:
                    report.locked = True
                    logger.info("Drain skipped: another drain is running")
                    return report
                body(lock, report)
                self.store.expire_dead()
                report.duration = time.monotonic() - started
                self.store.bump(counters(report, self.runtime.config.family_of))
                if not report.errors:
                    mark_drained(self.runtime)
        except (StoreUnavailable, redis.RedisError) as exc:
            # Nothing is lost: what was claimed comes due again when its lease ends.
            report.errors += 1
            report.next_in = None
            report.duration = time.monotonic() - started
            logger.error("Drain stopped, its store or Redis is unavailable: %s", exc)
        if report.replayed or report.dead or report.errors:
            logger.warning(
                "Drain: replayed=%d dead=%d skipped=%d errors=%d in %.2fs",
                report.replayed,
                report.dead,
                report.skipped,
                report.errors,
                report.duration,
            )
        return report

    def _names(self, breaker: str | None, report: DrainReport) -> list[str]:
        """The breakers to drain (all with parked entries unless one is named)."""
        names = [_internal(breaker)] if breaker is not None else sorted(self.store.breakers())
        for name in names:
            report.breakers.setdefault(name, {"replayed": 0, "dead": 0, "skipped": 0})
        return names

    def _publish(
        self, name: str, claimed: list[ParkedTask], report: DrainReport
    ) -> tuple[int, bool]:
        """Publish claimed entries and count them; (published, whether the broker looked down)."""
        outcome = self.batches.publish(name, claimed)
        stats = report.breakers[name]
        stats["replayed"] += outcome.published
        stats["dead"] += outcome.dead
        report.replayed += outcome.published
        report.dead += outcome.dead
        for key, n in outcome.dead_reasons.items():
            report.dead_reasons[key] = report.dead_reasons.get(key, 0) + n
        if outcome.down:
            report.errors += 1
        if self.progress is not None:
            self.progress(outcome.published + outcome.dead)
        return outcome.published, outcome.down

    def _skipped(self, name: str, report: DrainReport) -> int:
        left = self.store.due(name)
        report.breakers[name]["skipped"] = left
        report.skipped += left
        return left

    # -- one pass (beat) ---------------------------------------------------------------------
    def _know_families(self, names: list[str]) -> None:
        """Refresh what this process knows of each family with entries (a round trip each, at
        most twice a second): it tells which of its open members still hold."""
        bases = {self.runtime.config.family_of(name) for name in names} - {None}
        for base in sorted(b for b in bases if b is not None):
            if self.runtime.knowledge.family_due(base):
                self.runtime.refresh_family(base)

    def _step_breaker(
        self, name: str, budget: int | None, pace: DrainPace, room: QueueRoom, report: DrainReport
    ) -> tuple[int, int, float | None]:
        """Release what breaker ``name`` allows now; (released, how many the next pass would
        send if the rate allowed, seconds until the breaker may release what it holds back:
        ``None`` when it holds nothing back)."""
        allowance, snapshot = gate(self.runtime, name, pace)
        remember_held(self.runtime, name, snapshot, pace)
        due = self.store.due(name)
        window = None
        if due and allowance is None and name != NO_BREAKER:
            window = pace.window(name, snapshot)  # closed: the slow start
        caps = [self.config.drain_batch, due, window, budget]
        unpaced = min(c for c in caps if c is not None)
        want = min(c for c in (unpaced, int(pace.tokens), allowance) if c is not None)
        released = 0
        if want > 0:  # claimed first: which queue an entry goes to is in the entry
            claimed = self.store.claim(name, want, self.lease)
            go, wait = room.fit(claimed)
            if wait:  # their queue is full: due again at once, for the next pass
                self.store.release(name, [e.id for e in wait], self.runtime.now())
            if go:
                released, _ = self._publish(name, go, report)
        pace.spend(name if window is not None else None, released, window)
        if released and snapshot.get("state") == "half_open":
            pace.probes_sent(name, snapshot)  # one round per half-open: their outcome decides
        left = self._skipped(name, report)
        if allowance is None:
            return released, min(left, unpaced), None
        # Open, half-open or a full bulkhead: the breaker decides when the rest may go.
        return released, 0, held_for(snapshot, pace.now) if left else None

    # -- everything due (a person) -----------------------------------------------------------
    def _drain_breaker(
        self,
        name: str,
        limit: int | None,
        lock: Any,
        bucket: TokenBucket,
        report: DrainReport,
    ) -> int:
        released = 0
        probes_only = False
        while limit is None or released < limit:
            allowance, _ = gate(self.runtime, name)
            if allowance == 0 or (probes_only and allowance is not None):
                break  # open, or half-open probes already sent: the probes decide
            probes_only = allowance is not None
            want = self.config.drain_batch
            for cap in (allowance, None if limit is None else limit - released):
                if cap is not None:
                    want = min(want, cap)
            due = self.store.due(name)
            if not due:
                break  # nothing to wait for tokens for
            want = min(want, due)
            # Pace before claiming, so the wait never eats the lease of claimed entries.
            bucket.take(want)
            claimed = self.store.claim(name, want, self.lease)
            if not claimed:
                break
            published, down = self._publish(name, claimed, report)
            released += published
            if down:
                break  # the broker is down: stop this breaker, the rest was given back
            if hasattr(lock, "reacquire"):
                lock.reacquire()  # renew the lock's expiry for the next batch
        self._skipped(name, report)
        return released


def _internal(breaker: str) -> str:
    return NO_BREAKER if breaker in ("", "-", "none") else breaker
