"""The drain: bringing parked work back (claim under a lease, publish, ack).

At-least-once: an entry is removed only after its publish returned; a drainer that dies leaves
its claimed entries to come due again when their lease ends (duplicates: at most one batch).
One drainer at a time (``drain_lock.py``), the lock renewed after every batch.
Gating: a breaker that is open releases nothing, a half-open one no more than its free probe
permits (the probes decide), a closed one at ``resilience_drain_rate`` tasks/s.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from .drain_lock import drain_lock
from .errors import StoreUnavailable
from .events import replay_dispatcher
from .headers import rejected_replays
from .parked.entry import ParkedTask
from .parked.store import NO_BREAKER, BackoutStore, breaker_key, dead_code, dead_reason, held
from .parked.trust import TAMPERED
from .redact import get_logger
from .replay import Refusal, fail_task, preflight
from .runtime import Runtime
from .sending import Sender

logger = get_logger("celery_resilience.drain")

#: Seconds a claimed entry stays with the drainer before it is due again.
DEFAULT_LEASE = 60.0
#: Replays (counting those the breaker turned away) after which an entry is dead regardless.
REJECTED_REPLAYS_FACTOR = 10
#: When a publish fails, the entries it left are due again this much later (seconds).
PUBLISH_RETRY_DELAY = 5.0


@dataclass
class DrainReport:
    """What one drain run did; ``skipped`` are due entries held back (breaker, rate, limit)."""

    replayed: int = 0
    skipped: int = 0
    dead: int = 0
    errors: int = 0
    locked: bool = False  # another drain held the lock: this one did nothing
    duration: float = 0.0
    breakers: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Entries that died in this run, by ``<breaker>|<dead reason code>`` (metrics).
    dead_reasons: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The report as plain data (the ``celery_resilience.drain`` task's result)."""
        return asdict(self)


class TokenBucket:
    """``rate`` tokens per second, at most ``capacity`` saved up."""

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
        self.bucket = TokenBucket(self.config.drain_rate, self.config.drain_batch)

    def run(self, breaker: str | None = None, limit: int | None = None) -> DrainReport:
        started = time.monotonic()
        report = DrainReport()
        # Renewed after every batch; the next one may first wait drain_batch / drain_rate for
        # its tokens, and must then still be published within the lease.
        lock_ttl = self.lease + self.config.drain_batch / self.config.drain_rate
        try:
            with drain_lock(self.runtime, lock_ttl) as lock:
                if lock is None:
                    report.locked = True
                    logger.info("Drain skipped: another drain is running")
                    return report
                self._run(breaker, limit, lock, report)
                report.duration = time.monotonic() - started
                self.store.bump(_counters(report))
        except (StoreUnavailable, redis.RedisError) as exc:
            # Nothing is lost: what was claimed comes due again when its lease ends.
            report.errors += 1
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

    def _run(self, breaker: str | None, limit: int | None, lock: Any, report: DrainReport) -> None:
        names = [_internal(breaker)] if breaker is not None else sorted(self.store.breakers())
        budget = limit
        for name in names:
            done = self._drain_breaker(name, budget, lock, report)
            if budget is not None:
                budget -= done
                if budget <= 0:
                    break
        self.store.expire_dead()

    def _allowance(self, name: str) -> int | None:
        """How many entries the breaker lets through now: ``None`` = no gate, 0 = none."""
        if name == NO_BREAKER:
            return None
        breaker = self.runtime.breaker(name)
        snap = breaker.snapshot()
        state = snap["state"]
        if state in ("closed", "forced_closed"):
            return None
        if state == "half_open":
            return max(0, breaker.config.half_open_max_calls - int(snap["probes_in_flight"]))
        return 0

    def _drain_breaker(self, name: str, limit: int | None, lock: Any, report: DrainReport) -> int:
        stats = report.breakers.setdefault(name, {"replayed": 0, "dead": 0, "skipped": 0})
        released = 0
        probes_only = False
        while limit is None or released < limit:
            allowance = self._allowance(name)
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
            self.bucket.take(want)
            claimed = self.store.claim(name, want, self.lease)
            if not claimed:
                break
            published, dead, outage = self._publish_batch(name, claimed, report)
            released += published
            stats["replayed"] += published
            stats["dead"] += dead
            if self.progress is not None:
                self.progress(published + dead)
            if outage:
                break  # the broker is down: stop this breaker, the rest was given back
            if hasattr(lock, "reacquire"):
                lock.reacquire()  # renew the lock's expiry for the next batch
        stats["skipped"] = self.store.due(name)
        report.skipped += stats["skipped"]
        return released

    def _publish_batch(
        self, name: str, claimed: list[ParkedTask], report: DrainReport
    ) -> tuple[int, int, bool]:
        """Publish a claimed batch; ack what went out, mark dead what never can, give back the
        rest. An error that belongs to one entry never stops the entries behind it.

        Returns (published, dead, whether the broker looked down)."""
        now = self.runtime.now()
        ready: list[ParkedTask] = []
        dead: list[tuple[ParkedTask, str]] = []
        for entry in claimed:
            if held(entry.reason):  # written before held entries left the ready set
                self.store.release(name, [entry.id], math.inf)
                continue
            refusal = self._refusal(entry, now)
            if refusal is None and breaker_key(entry.breaker) != name:
                # Its signed payload names another breaker: moved into this ready set beside
                # it, around the gate of its own breaker.
                refusal = Refusal(TAMPERED, f"entry {entry.id} sits under breaker {name!r}")
            if refusal is None:
                ready.append(entry)
            else:
                dead.append((entry, refusal.dead_reason))
        with (
            self.runtime.app.producer_or_acquire() as producer,
            replay_dispatcher(self.runtime.app) as events,
        ):
            sent = Sender(self.runtime, producer).send(ready)
            for entry in sent.published:
                events.replayed(entry)  # after the publish: the entry is on its way now
        if sent.down:
            report.errors += 1
        for entry, failure in sent.suspects:
            if sent.published or failure.kind == "entry":
                dead.append((entry, dead_reason("unpublishable", str(failure))))
            else:  # refused, alone: the entry can't be told from the broker; again later
                sent.give_back.append(entry)
        self.store.ack(name, [e.id for e in sent.published])
        for entry, reason in dead:
            if not self.store.mark_dead(entry.id, reason):
                continue  # deleted or purged meanwhile: nobody waits for it here
            counter = f"{name}|{dead_code(reason)}"
            report.dead_reasons[counter] = report.dead_reasons.get(counter, 0) + 1
            logger.error("Entry %s (%s) is dead: %s", entry.id, entry.task_name, reason)
            fail_task(self.runtime, entry, reason)  # its workflow must not wait for it
        if sent.give_back:
            self.store.release(name, [e.id for e in sent.give_back], now + PUBLISH_RETRY_DELAY)
        report.replayed += len(sent.published)
        report.dead += len(dead)
        return len(sent.published), len(dead), sent.down

    def _refusal(self, entry: ParkedTask, now: float) -> Refusal | None:
        refusal = preflight(self.runtime, entry, now)
        if refusal is not None:
            return refusal
        rejected = rejected_replays(entry.options.get("headers"))
        # Replays the breaker turned away unrun are not attempts; a hard cap still ends a
        # task that is turned away forever.
        if entry.replays - rejected >= self.config.max_replays or (
            entry.replays >= self.config.max_replays * REJECTED_REPLAYS_FACTOR
        ):
            return Refusal(
                "max_replays",
                f"{entry.task_name}[{entry.task_id}] was replayed {entry.replays} times",
            )
        return None


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
