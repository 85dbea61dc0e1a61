"""The breaker as callers see it: admission, ``call()``, operator orders, transition listeners.

The protocol is Resilience4j's: acquire a permit, run the call with nothing held, record the
outcome. On a closed breaker that the process knows for sure (``knowledge.py``) the permit costs no
round trip, and successes are counted in the process and sent at most once a second, or at once
when they end a streak of failures; a failure is always recorded at once.

What a caller holds lives apart: ``Permit`` and ``Admission`` in ``permit.py``; so does the
outage state that every breaker of an app shares, ``RedisHealth`` in ``health.py``. A breaker with
a ``rate_limit`` takes one of the calls its process leased from the fleet's rate before it
admits a call (``rate.py``): a batch is leased in one round trip, the calls in it cost none.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import redis

from ..config import BreakerConfig
from ..errors import REFUSALS, BreakerOpen, BulkheadFull, RateLimited
from ..redact import get_logger
from ..redis_io import unavailable
from . import aio
from .aio import AsyncPermit
from .fallback import Counter, Fallback, FallbackLog, announce
from .fallback import check as check_fallback
from .health import RedisHealth
from .knowledge import Knowledge, forks
from .permit import Admission, Outcome, Permit
from .rate import ASK, RateLease
from .store import BreakerStore, DeliveryQuestions
from .types import STATES, Action, Change, Decision, Limits, State, Transition

logger = get_logger("celery_resilience.breaker")

R = TypeVar("R")
TransitionListener = Callable[[str, Transition, State], None]
#: Deferred successes reach Redis at least this often (seconds) under steady traffic, with an
#: admission or as a record of their own.
FLUSH_INTERVAL = 1.0


class Breaker:
    """One named breaker, shared through its store by every process that names it."""

    def __init__(
        self,
        name: str,
        config: BreakerConfig,
        store: Callable[[], BreakerStore],
        health: RedisHealth,
        listeners: list[TransitionListener] | None = None,
        knowledge: Knowledge | None = None,
        base: str | None = None,
        fallbacks: Counter | None = None,
    ) -> None:
        self.name = name
        self.config = config
        #: The declared breaker a derived one (``<base>:<key>``, named at call time) belongs to.
        self.base = base
        self.slow = config.slow_call_seconds
        self.limits = Limits.of(config, derived=base is not None)
        #: A derived breaker's successes go to Redis with its family's, unless the failure rate
        #: needs each one in its own window.
        self._family_successes = base is not None and not config.failure_rate_threshold
        #: With a bulkhead every call takes and frees a slot in Redis: no call is answered alone.
        self.bulkhead = config.max_concurrent_calls is not None
        per_second = config.rate_per_second
        #: The calls this process leased from the breaker's ``rate_limit`` (``None``: no limit).
        self.rate = None if per_second is None else RateLease(per_second)
        self._store = store
        self._health = health
        self._knowledge = knowledge if knowledge is not None else Knowledge(store)
        self.listeners = listeners if listeners is not None else []
        #: Counts a call's fallback (breaker, reason) for the metrics; ``None``: not counted.
        self._count_fallback = fallbacks
        self._fallback_log = FallbackLog(name)
        self._lock = threading.Lock()
        self._deferred = 0
        self._forks = forks()  # deferred successes belong to this process, not a forked child
        self._last_flush = time.monotonic()

    def __repr__(self) -> str:
        return f"<Breaker {self.name!r}>"

    # -- the call protocol --------------------------------------------------------------
    def acquire(self) -> Permit:
        """A permit for one call; :class:`BreakerOpen` when the breaker rejects it,
        :class:`RateLimited` when its ``rate_limit`` does."""
        admission = self.admit()
        if admission.rejected is not None:
            raise admission.rejected
        assert admission.permit is not None
        return admission.permit

    def admit(self, delivery: DeliveryQuestions | None = None, permit_id: str = "") -> Admission:
        """``acquire`` without raising, answering the task-level ``delivery`` questions too.

        A closed breaker that this process knows for sure (see ``knowledge.py``) admits without a
        round trip; anything else asks Redis, and the answer teaches the process again.
        ``permit_id`` names what the permit holds in Redis (a task delivery's token, so that
        another process can :meth:`release_lost` it); by default one of its own. With a
        ``rate_limit``, a call of the rate is taken first, and given back if the breaker turns
        the call down.
        """
        if self.rate is not None:
            limited = self._rate_refusal(self.rate, permit_id)
            if limited is not None:
                return limited
            admission = self._admit(delivery, permit_id)
            if admission.permit is None:
                self.rate.give_back()
            return admission
        return self._admit(delivery, permit_id)

    def _admit(self, delivery: DeliveryQuestions | None, permit_id: str) -> Admission:
        """The breaker's own admission (``admit`` less the rate limit)."""
        if delivery is None:
            permit = self._local_permit()
            if permit is not None:
                return Admission(permit, None)
        generation = self._knowledge.start()
        permit_id = permit_id or uuid.uuid4().hex
        # Deferred successes ride along once per FLUSH_INTERVAL.
        deferred = self._take_deferred() if self._flush_due() else 0
        try:
            decision = self._store().acquire(
                self.name, self.limits, permit_id, deferred, delivery=delivery
            )
        except redis.RedisError as exc:
            self._return_deferred(deferred)
            self._unreachable(exc)
            if self._health.policy == "fail_closed":
                return Admission(None, BreakerOpen(self.name, "unavailable"))
            return Admission(Permit(self, None, permit_id), None)
        self._health.ok()
        self._learn(decision, generation)
        if decision.transition:
            self._announce(decision.transition, decision.state)
        if decision.skip:
            wait = decision.claim_wait_us / 1e6
            return Admission(None, None, decision.deliveries, decision.skip, wait=wait)
        if not decision.allowed:
            retry = None if decision.retry_after_us is None else decision.retry_after_us / 1e6
            error = BulkheadFull if decision.full else BreakerOpen
            rejected = error(self.name, decision.state, retry)
            return Admission(None, rejected, decision.deliveries)
        claim = delivery.claim if delivery is not None and delivery.claims else ""
        permit = Permit(self, decision.kind, permit_id)
        return Admission(permit, None, decision.deliveries, claim=claim)

    def _local_permit(self) -> Permit | None:
        """A permit granted without a round trip, if the process may grant it alone (never with
        a bulkhead: its slot is taken in Redis)."""
        if self.bulkhead:
            return None
        if self.base is not None:
            if self._knowledge.admits_member(self.base, self.name):
                return Permit(self, "normal")
            return None
        if self._knowledge.admits(self.name) is not None:
            return Permit(self, "normal")
        return None

    def _rate_refusal(self, lease: RateLease, permit_id: str) -> Admission | None:
        """``None`` once a call of the rate limit is taken; else how the call is turned away
        (over the rate, or Redis unreachable under ``fail_closed``; ``fail_open`` lets it
        through unrecorded, as the admission would)."""
        try:
            wait = lease.take_or_lease(self._lease_batch)
        except redis.RedisError as exc:
            self._unreachable(exc)
            if self._health.policy == "fail_closed":
                return Admission(None, BreakerOpen(self.name, "unavailable"))
            return Admission(Permit(self, None, permit_id), None)
        if wait > 0:
            return Admission(None, RateLimited(self.name, wait))
        return None

    def _lease_batch(self, refused: int) -> int:
        """One round trip for a batch of the rate limit (``lua/rate.lua``), counting the
        ``refused`` calls: microseconds until one would be granted (0: granted)."""
        assert self.rate is not None
        lease = self.rate
        wait_us = self._store().lease_rate(
            self.name, self.limits, lease.span_us, lease.burst_us, refused
        )
        self._health.ok()
        return wait_us

    def _quick_permit(self) -> Permit | None:
        """A permit granted with no round trip at all (an asyncio caller's, on its event
        loop), or ``None``: ask through :meth:`admit`. Raises :class:`RateLimited` when the
        process knows the rate limit turns the call away."""
        lease = self.rate
        if lease is None:
            return self._local_permit()
        wait = lease.take()
        if wait == ASK:
            return None
        if wait > 0:
            raise RateLimited(self.name, wait)
        permit = self._local_permit()
        if permit is None:
            lease.give_back()  # admit() takes its own
        return permit

    def call(
        self, fn: Callable[..., R], /, *args: Any, fallback: Fallback | None = None, **kwargs: Any
    ) -> R:
        """Run ``fn`` through the breaker; raises :class:`BreakerOpen` when not admitted,
        :class:`RateLimited` when over the breaker's ``rate_limit``, or with ``fallback``
        returns ``fallback(refusal)`` instead (``fallback.py``). A failure
        of ``fn`` is recorded and raised either way. ``fallback`` is this method's own keyword:
        a function whose parameter has that name is wrapped (``functools.partial``)."""
        if fallback is None:
            with self.acquire():
                self._fallback_log.admitted()
                return fn(*args, **kwargs)
        check_fallback(fallback)
        try:
            permit = self.acquire()
        except REFUSALS as refusal:
            announce(refusal, self._fallback_log, self._count_fallback)
            return cast(R, fallback(refusal))
        self._fallback_log.admitted()
        with permit:
            return fn(*args, **kwargs)

    async def acall(
        self,
        fn: Callable[..., Awaitable[R]],
        /,
        *args: Any,
        fallback: Fallback | None = None,
        **kwargs: Any,
    ) -> R:
        """``call`` for a coroutine function, awaited without blocking the event loop; a
        ``fallback`` may be a coroutine function too (what it returns is awaited if it is
        awaitable)."""
        if fallback is None:
            async with self.permit():
                self._fallback_log.admitted()
                return await fn(*args, **kwargs)
        check_fallback(fallback)
        try:
            permit = await aio.acquire(self)
        except REFUSALS as refusal:
            announce(refusal, self._fallback_log, self._count_fallback)
            value = fallback(refusal)
            return cast(R, await value if inspect.isawaitable(value) else value)
        self._fallback_log.admitted()
        async with aio.AsyncPermit(self, permit):
            return await fn(*args, **kwargs)

    def permit(self) -> AsyncPermit:
        """``async with breaker.permit():`` admits the block as ``acquire`` would (see ``aio``)."""
        return AsyncPermit(self)

    def retry_allowed(self) -> bool:
        """Whether one more retry of a call through this breaker is within its retry budget
        (``retry_budget``), taking it from the budget if so: ask once per retry, right before
        making it. ``True`` with no round trip when the breaker has no budget; when Redis
        can't be reached, ``resilience_on_redis_error`` answers (``fail_open``: yes)."""
        return self.spend_retries(1) == 1

    def spend_retries(self, wanted: int) -> int:
        """Take up to ``wanted`` retries (a drain's batch of replays) from the retry budget:
        how many it granted (all of them without a budget)."""
        ratio = self.config.retry_budget
        if ratio is None or wanted <= 0:
            return max(0, wanted)
        floor = self.config.min_retries_per_second
        try:
            granted = self._store().spend_retries(self.name, self.limits, ratio, floor, wanted)
        except redis.RedisError as exc:
            self._unreachable(exc)
            return 0 if self._health.policy == "fail_closed" else wanted
        self._health.ok()
        return granted

    def known_state(self) -> State:
        """The state as this process knows it: no round trip while the change feed keeps its
        view current; else one (that teaches the view). Unlike :attr:`state`, an open breaker
        whose timeout has passed stays ``open`` until a caller asks for a probe."""
        generation = self._knowledge.start()
        if self.base is not None and self._knowledge.admits_member(self.base, self.name):
            return "closed"
        view = self._knowledge.known(self.name)
        if view is not None:
            return view.state
        with unavailable("breaker store"):
            # A release of nothing: the view's reply without changing it (as ``flush`` sends).
            change = self._store().release(self.name, self.limits, "normal", "", 0)
        self._learn(change, generation)
        return change.state

    def _record(self, permit: Permit, outcome: Outcome, least_open: float | None = None) -> None:
        assert permit.kind is not None
        if self._defer(permit, outcome):
            if self._family_refresh_due():
                self.refresh_family()
            return
        # A failure, a success that ends a streak, or a due flush: sent now, with this
        # process's deferred successes first.
        generation = self._knowledge.start()
        deferred = self._take_deferred()
        store = self._store()
        try:
            if outcome == "release":
                change = store.release(
                    self.name, self.limits, permit.kind, permit.permit_id, deferred
                )
            else:
                change = store.record(
                    self.name,
                    self.limits,
                    permit.kind,
                    permit.permit_id,
                    outcome == "success",
                    deferred,
                    least_open_us=round(least_open * 1_000_000) if least_open else 0,
                )
        except redis.RedisError as exc:
            self._return_deferred(deferred)  # they still happened: the next record carries them
            self._unreachable(exc)
            return
        self._health.ok()
        self._learn(change, generation)
        if change.transition:
            self._announce(change.transition, change.state)

    def _learn(self, reply: Decision | Change, generation: int) -> None:
        """What a script's reply teaches this process: the breaker's view, or for a derived
        breaker its family's (asked again when the reply can't confirm it)."""
        if self.base is None:
            self._knowledge.learn(
                self.name, reply.version, reply.state, reply.streak, reply.epoch, generation
            )
            return
        confirmed = self._knowledge.confirm_family(self.base, self.name, reply, generation)
        if not confirmed and self._knowledge.family_due(self.base):
            self.refresh_family(generation)

    def refresh_family(self, generation: int | None = None) -> None:
        """Ask Redis how this derived breaker's family is (one round trip), sending the
        successes this process held back on its members."""
        assert self.base is not None
        try:
            self._knowledge.refresh_family(self.base, self.limits.idle_us, generation)
        except redis.RedisError as exc:
            self._unreachable(exc)

    def _defer(self, permit: Permit, outcome: Outcome) -> bool:
        """Count a success in the process if it needs no round trip; ``False`` if it does.
        Never a round trip itself (asyncio callers run it on their event loop): a derived
        breaker's family may be due a refresh after it (:meth:`_family_refresh_due`)."""
        if outcome != "success" or permit.kind != "normal" or self.bulkhead:
            return False  # a bulkhead's slot is freed by the record
        if self.base is not None:
            # A member known closed: its family's next refresh (at most one a flush interval)
            # carries the success; the refresh also keeps the family known.
            if not (self._family_successes and self._knowledge.admits_member(self.base, self.name)):
                return False
            return self._knowledge.defer_member_success(self.base)
        if self._may_defer():
            with self._lock:
                self._forget_inherited()
                self._deferred += 1
            return True
        return False

    def _family_refresh_due(self) -> bool:
        """Whether this derived breaker's family is due a refresh (:meth:`refresh_family`)."""
        return self.base is not None and self._knowledge.family_due(self.base)

    def _may_defer(self) -> bool:
        """A success may wait for the next flush only if it ends no streak of failures (known
        for sure: a closed breaker without one), no flush is due and it frees no bulkhead slot."""
        if self.bulkhead:
            return False
        view = self._knowledge.admits(self.name)
        return view is not None and not view.streak and not self._flush_due()

    def _unreachable(self, exc: redis.RedisError) -> None:
        self._knowledge.forget()  # whatever happens meanwhile, this process won't hear of it
        self._health.failed(self.name, exc)

    def _flush_due(self) -> bool:
        return time.monotonic() - self._last_flush >= FLUSH_INTERVAL

    def _forget_inherited(self) -> None:
        # After a fork the child holds a copy of the parent's count; the parent reports it.
        if self._forks != forks():
            self._forks, self._deferred = forks(), 0

    def _take_deferred(self) -> int:
        with self._lock:
            self._forget_inherited()
            deferred, self._deferred = self._deferred, 0
            self._last_flush = time.monotonic()
        return deferred

    def _return_deferred(self, count: int) -> None:
        with self._lock:
            self._deferred += count

    def flush(self) -> None:
        """Send deferred successes now (at worker shutdown, or before reading exact counts),
        and the calls the rate limit turned away here since the last lease."""
        self._flush_refused()
        deferred = self._take_deferred()
        if deferred:
            try:
                # Sent as deferred, with nothing else: they end no streak (see _may_defer).
                self._store().release(self.name, self.limits, "normal", "", deferred)
            except redis.RedisError as exc:
                self._return_deferred(deferred)
                self._unreachable(exc)

    def _flush_refused(self) -> None:
        lease = self.rate
        refused = 0 if lease is None else lease.reported()
        if lease is None or not refused:
            return
        try:
            # A lease of no calls (no span, no burst) takes nothing from the rate: it counts.
            self._store().lease_rate(self.name, self.limits, 0, 0, refused)
        except redis.RedisError as exc:
            lease.unreported(refused)
            self._unreachable(exc)

    # -- looking and steering -----------------------------------------------------------
    @property
    def state(self) -> State:
        """The shared state now: closed, open, half_open, forced_open or forced_closed."""
        state = self.snapshot()["state"]
        assert state in STATES
        return cast(State, state)

    def snapshot(self) -> dict[str, Any]:
        """State, counters, window counts, ``opened_at`` / ``open_until`` (epoch seconds)."""
        with unavailable("breaker store"):
            return self._store().snapshot(self.name, self.limits)

    def force_open(self) -> None:
        """Hold the breaker open (every call rejected) until ``force_closed`` or ``reset``."""
        self._force("open")

    def force_closed(self) -> None:
        """Hold the breaker closed (every call admitted, nothing trips it) until ``reset``."""
        self._force("closed")

    def reset(self) -> None:
        """Back to a fresh closed breaker; the ``*_total`` counters are kept."""
        self._force("reset")

    def release_lost(self, permit_id: str) -> None:
        """Free what permit ``permit_id`` held in Redis (a probe's lease, a bulkhead slot) when
        the process that held it died before it could say how its call ended: nothing is
        judged, whatever the permit's kind."""
        generation = self._knowledge.start()
        with unavailable("breaker store"):
            change = self._store().release(self.name, self.limits, "probe", permit_id)
        self._changed(change, generation)

    def open_for_window(self, window: str, until: float | None) -> None:
        """``force_open`` for maintenance window ``window`` (``maintenance.py``), which holds
        the breaker until ``until`` (epoch seconds; ``None``: until a person's order)."""
        self._force("open", window, 0 if until is None else max(1, round(until * 1_000_000)))

    def end_window(self, window: str, recorded_at: float = 0.0) -> bool:
        """Reset the breaker if maintenance window ``window`` still holds it and has ended
        (one atomic step); whether it did. ``window`` ``""``: a record of the previous release
        without an id, written at ``recorded_at`` (epoch seconds)."""
        generation = self._knowledge.start()
        recorded_us = round(recorded_at * 1_000_000)
        with unavailable("breaker store"):
            change = self._store().end_window(self.name, self.limits, window, None, recorded_us)
        return self._changed(change, generation)

    def _force(self, action: Action, window: str = "", until_us: int = 0) -> None:
        generation = self._knowledge.start()
        with unavailable("breaker store"):
            change = self._store().force(self.name, self.limits, action, None, window, until_us)
        self._changed(change, generation)

    def _changed(self, change: Change, generation: int) -> bool:
        """Learn an order's reply, and announce its transition; whether it made one."""
        self._learn(change, generation)
        if change.transition:
            self._announce(change.transition, change.state)
        return change.transition is not None

    def _announce(self, transition: Transition, state: State) -> None:
        """Only the caller whose script made the transition gets here: log and notify once."""
        level = logging.WARNING if transition in ("opened", "forced_open") else logging.INFO
        logger.log(level, "Breaker %r %s (now %s)", self.name, transition.replace("_", " "), state)
        for listener in self.listeners:
            try:
                listener(self.name, transition, state)
            except Exception:
                logger.exception("Breaker transition listener %r failed", listener)
