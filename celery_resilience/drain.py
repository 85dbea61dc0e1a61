"""The drain: bringing parked work back (claim under a lease, publish, ack).

At-least-once: an entry is removed only after its publish returned; a drainer that dies leaves
its claimed entries to come due again when their lease ends (duplicates: at most one batch).
One drainer at a time (``drain_lock.py``), the lock renewed after every batch.
Gating: a breaker that is open releases nothing, a half-open one no more than its free probe
permits (the probes decide), a closed one what the pace allows; a full bulkhead releases
nothing, whatever the state.

Two ways to run it:

- :meth:`Drainer.step`, beat's ``celery_resilience.drain`` task: one pass that releases what is
  allowed *now* and returns, never waiting (a worker's pool slot is never held idle). What is
  allowed: room in the replay's queue (``queue_room.py``), the slow start after a close and the
  rate ceiling (``drain_pace.py``). Its report says when another pass has work (``next_in``).
- :meth:`Drainer.run`, a person's ``celery resilience drain``: everything due now, in batches of
  ``resilience_drain_batch`` paced at ``resilience_drain_rate``, waiting between them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from .drain_batch import BatchPublisher
from .drain_lock import drain_lock
from .drain_pace import DrainPace, TokenBucket
from .errors import StoreUnavailable
from .parked.entry import ParkedTask
from .parked.store import NO_BREAKER, BackoutStore
from .queue_room import QueueRoom
from .redact import get_logger
from .runtime import Runtime

logger = get_logger("celery_resilience.drain")

#: Seconds a claimed entry stays with the drainer before it is due again.
DEFAULT_LEASE = 60.0
#: Shortest wait before the next pass of a drain that has more to send (seconds): each pass is a
#: short task of its own, and this bounds how often one runs.
FOLLOW_UP_MIN = 0.25
#: Wait before the next pass when the replays' queue was full (seconds): the workers are busy.
FOLLOW_UP_BUSY = 0.5


@dataclass
class DrainReport:
    """What one drain run did; ``skipped`` are due entries held back (breaker, rate, limit)."""

    replayed: int = 0
    skipped: int = 0
    dead: int = 0
    errors: int = 0
    locked: bool = False  # another drain held the lock: this one did nothing
    duration: float = 0.0
    #: Seconds after which another pass has work (entries left that the pace or the queue
    #: held back); ``None``: nothing to do before the next beat tick.
    next_in: float | None = None
    breakers: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Entries that died in this run, by ``<breaker>|<dead reason code>`` (metrics).
    dead_reasons: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The report as plain data (the ``celery_resilience.drain`` task's result)."""
        return asdict(self)


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
            for name in self._names(breaker, report):
                if budget is not None and budget <= 0:
                    break
                released, more = self._step_breaker(name, budget, pace, room, report)
                budget = None if budget is None else budget - released
                wanted = max(wanted, more)
                busy = busy or (more > 0 and room.full())
            pace.save()
            if room.unreadable:
                report.errors += 1
            elif wanted:  # the next pass when the bucket holds what it will want
                wait = max(FOLLOW_UP_MIN, pace.seconds_for(wanted))
                report.next_in = max(wait, FOLLOW_UP_BUSY) if busy else wait

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
                self.store.bump(_counters(report))
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

    def _gate(self, name: str) -> tuple[int | None, Mapping[str, Any]]:
        """How many entries the breaker lets through now (``None`` = no gate, 0 = none), and
        the snapshot that says so."""
        if name == NO_BREAKER:
            return None, {}
        breaker = self.runtime.breaker(name)
        snap = breaker.snapshot()
        state = snap["state"]
        limit = breaker.config.max_concurrent_calls
        if limit is not None and int(snap["calls_in_flight"]) >= limit:
            return 0, snap  # a full bulkhead: the dependency is busy (or hangs): replays bounce
        if state in ("closed", "forced_closed"):
            return None, snap
        if state == "half_open":
            free = breaker.config.half_open_max_calls - int(snap["probes_in_flight"])
            return max(0, free), snap
        return 0, snap

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
    def _step_breaker(
        self, name: str, budget: int | None, pace: DrainPace, room: QueueRoom, report: DrainReport
    ) -> tuple[int, int]:
        """Release what breaker ``name`` allows now; (released, how many the next pass would
        send if the rate allowed: 0 when nothing waits or the breaker decides)."""
        allowance, snapshot = self._gate(name)
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
        left = self._skipped(name, report)
        # A half-open breaker's probes decide (beat asks again); an open one releases nothing.
        return released, min(left, unpaced) if allowance is None else 0

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
            allowance, _ = self._gate(name)
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


def _counters(report: DrainReport) -> dict[str, float]:
    """What a run adds to the store's monotonic counters (metrics)."""
    counters: dict[str, float] = {"drain_runs": 1, "drain_seconds": report.duration}
    for name, stats in report.breakers.items():
        for what in ("replayed", "dead"):
            if stats[what]:
                counters[f"{what}|{name}"] = stats[what]
    for key, n in report.dead_reasons.items():
        counters[f"dead_reason|{key}"] = n
    return counters


def _internal(breaker: str) -> str:
    return NO_BREAKER if breaker in ("", "-", "none") else breaker
