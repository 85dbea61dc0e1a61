"""Bringing parked work back: the drain (claim under a lease, publish, ack) and replay.

At-least-once: an entry is removed only after its publish returned; a drainer that dies leaves
its claimed entries to come due again when their lease ends (duplicates: at most one batch).
One drainer at a time: a Redis lock with a token and an expiry, renewed every batch.
Gating: a breaker that is open releases nothing, a half-open one no more than its free probe
permits (the probes decide), a closed one at ``resilience_drain_rate`` tasks/s.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import redis
from redis.exceptions import LockError

from .errors import StoreUnavailable
from .events import replay_dispatcher
from .headers import rejected_replays
from .parked.entry import ParkedTask
from .parked.redis import BackoutKeys
from .parked.store import NO_BREAKER, BackoutStore, dead_reason, held
from .redact import get_logger
from .replay import BrokerErrors, PublishFailure, Refusal, preflight, publish

if TYPE_CHECKING:
    from .resilience import Resilience

logger = get_logger("celery_resilience.drain")

#: Seconds a claimed entry stays with the drainer before it is due again.
DEFAULT_LEASE = 60.0
#: Replays (counting those the breaker turned away) after which an entry is dead regardless.
REJECTED_REPLAYS_FACTOR = 10
#: When a publish fails, the entries it left are due again this much later (seconds).
PUBLISH_RETRY_DELAY = 5.0
#: Tries of one entry's publish before its error is taken for the entry's own.
PUBLISH_TRIES = 3
#: Entries refused in a row, none published, after which the broker is taken to be refusing
#: everything (out of memory, read-only) rather than those entries.
SUSPECTS_BEFORE_OUTAGE = 3
_local_locks: dict[int, threading.Lock] = {}


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

    def as_dict(self) -> dict[str, Any]:
        """The report as plain data (the ``celery_resilience.drain`` task's result)."""
        return asdict(self)


@dataclass
class Sent:
    """What publishing a batch came to: published, failed (entry, failure), to give back."""

    published: list[ParkedTask]
    suspects: list[tuple[ParkedTask, PublishFailure]]
    give_back: list[ParkedTask]
    down: bool


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


@contextmanager
def drain_lock(resilience: Resilience, lease: float, wait: float = 0.0) -> Iterator[Any]:
    """The one-drainer-at-a-time lock; yields ``None`` when someone else holds it.

    It lives in the breakers' Redis whatever the store (a database store included), so it is
    fleet-wide; only the ``memory://`` backend, one process by definition, uses a local lock.
    """
    store = resilience.backout_store
    if not resilience.config.in_memory:
        name = f"{BackoutKeys.for_prefix(resilience.config.key_prefix).tag}:drain-lock"
        lock = resilience.redis.lock(name, timeout=lease, blocking=wait > 0, blocking_timeout=wait)
        try:
            acquired = lock.acquire()
        except redis.RedisError as exc:
            raise StoreUnavailable(f"drain lock unavailable: {exc}") from exc
        if not acquired:
            yield None
            return
        try:
            yield lock
        finally:
            try:
                lock.release()
            except LockError:  # expired meanwhile: someone else may hold it now; not ours to free
                logger.warning("Drain lock expired before release")
            except redis.RedisError as exc:  # Redis went away: the lock expires by itself
                logger.warning("Drain lock not released (%s); it expires in %.0fs", exc, lease)
        return
    local = _local_locks.setdefault(id(store), threading.Lock())
    acquired = local.acquire(timeout=wait) if wait > 0 else local.acquire(blocking=False)
    if not acquired:
        yield None
        return
    try:
        yield local
    finally:
        local.release()


class Drainer:
    """One drain run over the breakers asked for (all that have parked entries by default)."""

    def __init__(self, resilience: Resilience, lease: float = DEFAULT_LEASE) -> None:
        self.resilience = resilience
        self.store: BackoutStore = resilience.backout_store
        self.config = resilience.config
        self.lease = lease
        self.bucket = TokenBucket(self.config.drain_rate, self.config.drain_batch)

    def run(self, breaker: str | None = None, limit: int | None = None) -> DrainReport:
        started = time.monotonic()
        report = DrainReport()
        # Renewed after every batch; the next one may first wait drain_batch / drain_rate for
        # its tokens, and must then still be published within the lease.
        lock_ttl = self.lease + self.config.drain_batch / self.config.drain_rate
        try:
            with drain_lock(self.resilience, lock_ttl) as lock:
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
        breaker = self.resilience.breaker(name)
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
        now = self.resilience.now()
        ready: list[ParkedTask] = []
        dead: list[tuple[ParkedTask, str]] = []
        for entry in claimed:
            if held(entry.reason):  # written before held entries left the ready set
                self.store.release(name, [entry.id], math.inf)
                continue
            refusal = self._refusal(entry, now)
            if refusal is None:
                ready.append(entry)
            else:
                dead.append((entry, refusal.dead_reason))
        with (
            self.resilience.app.producer_or_acquire() as producer,
            replay_dispatcher(self.resilience.app) as events,
        ):
            sent = self._send(ready, producer, BrokerErrors(self.resilience.app))
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
            self.store.mark_dead(entry.id, reason)
            logger.error("Entry %s (%s) is dead: %s", entry.id, entry.task_name, reason)
        if sent.give_back:
            self.store.release(name, [e.id for e in sent.give_back], now + PUBLISH_RETRY_DELAY)
        report.replayed += len(sent.published)
        report.dead += len(dead)
        return len(sent.published), len(dead), sent.down

    def _send(self, entries: list[ParkedTask], producer: Any, errors: BrokerErrors) -> Sent:
        """Publish ``entries`` in one batch where the transport can (kombu's ``Producer.batch``:
        one Redis pipeline), and one by one where it can't or the batch as a whole failed."""
        if not entries or not producer.supports_batch_publish:
            return self._send_one_by_one(entries, producer, errors)
        buffered: list[ParkedTask] = []
        made_badly: list[tuple[ParkedTask, PublishFailure]] = []
        rest: list[ParkedTask] = []
        try:
            # Room for every command of the batch: kombu would flush early otherwise, and a
            # failed early flush would surface as the error of whichever entry came next.
            with producer.batch(max_size=4 * len(entries) + 16):
                for index, entry in enumerate(entries):
                    try:
                        publish(self.resilience, entry, producer)
                    except Exception as exc:
                        failure = errors.classify(exc)
                        if failure.kind == "outage":  # the broker went away: send what is in
                            rest = entries[index:]
                            break
                        made_badly.append((entry, failure))  # the message could not be made
                    else:
                        buffered.append(entry)
        except Exception as exc:  # the batch went to the broker and failed there
            failure = errors.classify(exc)
            logger.warning("Publishing a batch of %d failed (%s)", len(buffered), failure)
            if failure.kind == "outage":
                return Sent([], [], entries, down=True)
            # Refused: find which entry, one by one (those the broker took meanwhile go twice).
            again = self._send_one_by_one(buffered, producer, errors)
            again.suspects += made_badly
            return again
        return Sent(buffered, made_badly, rest, down=bool(rest))

    def _send_one_by_one(
        self, entries: list[ParkedTask], producer: Any, errors: BrokerErrors
    ) -> Sent:
        sent = Sent([], [], [], down=False)
        for index, entry in enumerate(entries):
            failure = self._publish(entry, producer, errors)
            if failure is None:
                sent.published.append(entry)
                continue
            sent.suspects.append((entry, failure))
            refused_all = not sent.published and all(f.kind == "refused" for _, f in sent.suspects)
            if failure.kind == "outage" or (
                refused_all and len(sent.suspects) >= SUSPECTS_BEFORE_OUTAGE
            ):
                # The broker is down, or refuses everything: stop, give the rest back.
                logger.error(
                    "Publishing %s[%s] failed: %s", entry.task_name, entry.task_id, failure
                )
                sent.down = True
                sent.give_back += [e for e, _ in sent.suspects] + entries[index + 1 :]
                sent.suspects = []
                break
        return sent

    def _publish(
        self, entry: ParkedTask, producer: Any, errors: BrokerErrors
    ) -> PublishFailure | None:
        """Publish ``entry``, a few tries unless the broker is down; ``None`` once it went out."""
        failure = None
        for _ in range(PUBLISH_TRIES):
            try:
                publish(self.resilience, entry, producer)
            except Exception as exc:
                failure = errors.classify(exc)
                if failure.kind == "outage":
                    break
            else:
                return None
        return failure

    def _refusal(self, entry: ParkedTask, now: float) -> Refusal | None:
        refusal = preflight(self.resilience, entry, now)
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


def replay(resilience: Resilience, entry_id: str) -> ParkedTask:
    """Publish one entry now, whatever its breaker says (a person asked), then remove it.

    ``KeyError`` if absent; ``ValueError`` saying why if a worker would refuse it (an expired
    entry is marked dead on the way, as the drain would).
    """
    store = resilience.backout_store
    with drain_lock(resilience, DEFAULT_LEASE, wait=10.0) as lock:
        if lock is None:
            raise TimeoutError("a drain holds the lock; try again in a moment")
        entry = store.get(entry_id)
        if entry is None:
            raise KeyError(entry_id)
        refusal = preflight(resilience, entry, resilience.now())
        if refusal is not None:
            if refusal.dead_reason == "expired":
                store.mark_dead(entry_id, refusal.dead_reason)
            raise ValueError(refusal.message)
        publish(resilience, entry)
        with replay_dispatcher(resilience.app) as events:
            events.replayed(entry)
        store.delete(entry_id)
        store.bump({f"replayed|{_internal(entry.breaker or NO_BREAKER)}": 1})
    logger.warning("Replayed %s[%s] (entry %s)", entry.task_name, entry.task_id, entry_id)
    return entry


def _counters(report: DrainReport) -> dict[str, float]:
    """What a run adds to the store's monotonic counters (metrics)."""
    counters: dict[str, float] = {"drain_runs": 1, "drain_seconds": report.duration}
    for name, stats in report.breakers.items():
        for what in ("replayed", "dead"):
            if stats[what]:
                counters[f"{what}|{name}"] = stats[what]
    return counters


def _internal(breaker: str) -> str:
    return NO_BREAKER if breaker in ("", "-", "none") else breaker
