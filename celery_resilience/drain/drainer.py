"""The drain run: bringing parked work back (claim under a lease, publish, ack).

At-least-once: an entry is removed only after its publish returned; a drainer that dies leaves
its claimed entries to come due again when their lease ends (duplicates: at most one batch).
One drainer at a time (``lock.py``), the lock renewed after every batch.
Gating (``gate.py``): a breaker that is open replays nothing, a half-open one a round of
probes (``gate.half_open_probes``), a closed one what the pace allows; a bulkhead that stays
full replays nothing, whatever the state.

Each claimed batch goes to ``batch.py``, which checks, publishes and settles it, and gives back
what it did not replay.

Two ways to run it:

- :meth:`Drainer.drain_once`, beat's ``celery_resilience.drain`` task: one *pass*
  (``drain_pass.py``), which replays what is allowed now and returns, never waiting. Its
  report says when another pass has work (``next_in``).
- :meth:`Drainer.run`, a person's ``celery resilience drain``: everything due now, in batches of
  ``resilience_drain_batch`` paced at ``resilience_drain_rate``, waiting between them.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import redis

from ..backout.entry import ParkedTask
from ..backout.store import NO_BREAKER, BackoutStore
from ..errors import AccessDenied, StoreUnavailable
from ..redact import get_logger
from ..runtime import Runtime
from .batch import BatchPublisher
from .drain_pass import DrainPass
from .gate import decide, look
from .lock import drain_lock
from .pace import BreakerPace, TokenBucket
from .report import DrainReport, counters, figures, left_due, tally
from .status import mark_drained

logger = get_logger("celery_resilience.drain")

#: Seconds a claimed entry stays with the drainer before it is due again.
DEFAULT_LEASE = 60.0
#: What to do about a drain Redis refuses (``NOPERM``: said once, ``runtime.drain_trouble``).
DENIED_HELP = (
    "this process's Redis user may not write the drain's memory of consumed entries "
    "({<prefix>:backout}:consumed*): route celery_resilience.drain to a queue that only "
    "workers logged in as the drainer's user consume (see the threat model's ACL roles)"
)


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
                replayed = self._drain_breaker(name, budget, lock, bucket, report)
                budget = None if budget is None else budget - replayed

        return self._under_lock(lock_ttl, body, "run")

    def drain_once(self, breaker: str | None = None, limit: int | None = None) -> DrainReport:
        """One pass: what is allowed now, then return (beat's task); never waits for anything."""

        def body(lock: Any, report: DrainReport) -> None:
            names = self._names(breaker, report)
            drain_pass = DrainPass(self.runtime, self.batches, self.lease, report)
            drain_pass.run(names, every=breaker is None, limit=limit)

        return self._under_lock(self.lease, body, "pass")

    def step(self, breaker: str | None = None, limit: int | None = None) -> DrainReport:
        """Deprecated: :meth:`drain_once` (one pass)."""
        warnings.warn(
            "Drainer.step is deprecated: use Drainer.drain_once", DeprecationWarning, stacklevel=2
        )
        return self.drain_once(breaker, limit)

    # -- the two runs' shared frame ----------------------------------------------------------
    def _under_lock(
        self, lock_ttl: float, body: Callable[[Any, DrainReport], None], kind: str
    ) -> DrainReport:
        """The run ``body`` under the drain's lock, inside a span when tracing is on (``kind``:
        ``pass`` or ``run``)."""
        tracing = self.runtime.tracing
        if tracing is None:
            return self._locked(lock_ttl, body)
        return tracing.drain(kind, lambda: self._locked(lock_ttl, body), figures)

    def _locked(self, lock_ttl: float, body: Callable[[Any, DrainReport], None]) -> DrainReport:
        started = time.monotonic()
        report = DrainReport()
        try:
            with drain_lock(self.runtime, lock_ttl) as lock:
                if lock is None:
                    report.locked = True
                    logger.info("Drain skipped: another drain is running")
                    return report
                # Writes what every ack writes (the memory of consumed entries): a process
                # whose Redis user may not is refused here, before it publishes anything.
                self.store.forget_consumed()
                with self.batches.announcing():
                    body(lock, report)
                self.store.expire_dead()
                report.duration = time.monotonic() - started
                self.store.bump(counters(report, self.runtime.config.family_of))
                if not report.errors:
                    mark_drained(self.runtime)
            self.runtime.drain_trouble.ok()
        except AccessDenied as exc:
            # No retry helps: said once at ERROR. What was published and not acked stays
            # claimed until its lease ends, and the next pass is refused before it publishes.
            report.errors += 1
            report.next_in = None
            report.denied = str(exc)
            report.duration = time.monotonic() - started
            self.runtime.drain_trouble.failed(
                exc, "Drain refused, nothing more is published: %s", DENIED_HELP
            )
        except (StoreUnavailable, redis.RedisError) as exc:
            # Nothing is lost: what was claimed comes due again when its lease ends.
            report.errors += 1
            report.next_in = None
            report.duration = time.monotonic() - started
            logger.error("Drain stopped, its store or Redis is unavailable: %s", exc)
        refused_only = report.denied is not None and not (report.replayed or report.dead)
        if (report.replayed or report.dead or report.errors or report.held) and not refused_only:
            logger.warning(
                "Drain: replayed=%d dead=%d skipped=%d errors=%d in %.2fs%s",
                report.replayed,
                report.dead,
                report.skipped,
                report.errors,
                report.duration,
                f" (held for another process: {report.held})" if report.held else "",
            )
        return report

    def _names(self, breaker: str | None, report: DrainReport) -> list[str]:
        """The breakers to drain (all with parked entries unless one is named)."""
        names = [_internal(breaker)] if breaker is not None else sorted(self.store.breakers())
        for name in names:
            report.breakers.setdefault(name, {"replayed": 0, "dead": 0, "skipped": 0})
        return names

    def _publish(
        self, name: str, claimed: list[ParkedTask], report: DrainReport, now: float
    ) -> tuple[int, bool]:
        """Publish claimed entries and count them; (published, whether to stop: the broker looked
        down, or the breaker's retry budget is spent)."""
        outcome = self.batches.publish(name, claimed, None, now)
        tally(report, name, outcome)
        if self.progress is not None:
            self.progress(outcome.published + outcome.dead)
        return outcome.published, outcome.down or outcome.over_budget

    # -- everything due (a person) -----------------------------------------------------------
    def _drain_breaker(
        self,
        name: str,
        limit: int | None,
        lock: Any,
        bucket: TokenBucket,
        report: DrainReport,
    ) -> int:
        replayed = 0
        memory = BreakerPace()  # this run's own: one round of probes per half-open
        while limit is None or replayed < limit:
            seen = look(self.runtime, name)
            now = self.runtime.now()
            allowance = None
            probes_sent = None
            if seen is not None:
                gate = decide(seen, memory, now, patient=False)
                allowance, memory, probes_sent = gate.allowance, gate.memory, gate.probes_sent
            if allowance == 0:
                break  # open, a full bulkhead, or this half-open's probes sent: they decide
            want = self.config.drain_batch
            for cap in (allowance, None if limit is None else limit - replayed):
                if cap is not None:
                    want = min(want, cap)
            due = self.store.due(name, now)
            if not due:
                break  # nothing to wait for tokens for
            want = min(want, due)
            # Pace before claiming, so the wait never eats the lease of claimed entries.
            bucket.take(want)
            claimed = self.store.claim(name, want, self.lease)
            if not claimed:
                break
            published, stop = self._publish(name, claimed, report, now=now)
            replayed += published
            if probes_sent is not None:
                memory = probes_sent
            if stop:
                break  # the broker is down, or the budget spent: the rest was given back
            if hasattr(lock, "reacquire"):
                lock.reacquire()  # renew the lock's expiry for the next batch
        left_due(report, name, self.store.due(name))
        return replayed


def _internal(breaker: str) -> str:
    return NO_BREAKER if breaker in ("", "-", "none") else breaker
