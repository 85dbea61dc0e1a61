"""A delivery's fate, decided as a value: what becomes of a task's message, and what comes next
when carrying that out fails.

:func:`decide` maps how the call ended (``ending.py``: turned down at admission, or the body's
exception judged) to one fate: retry in N s, park with a reason and a due time, keep the message
in the broker, wait for another delivery of the task id, skip, or fail; :func:`instead` maps a
fate whose carrying out failed to the next one (a retry the broker refused parks, a park the
store refused keeps the message, a kept copy the broker refused requeues it). No fate acks a
message that has nowhere else to be: that is the no-loss promise, and ``tests/test_fate.py``
holds these two functions to it as a table. No I/O here: ``carry_out.py`` performs a fate, the
task and the worker's time limit end the delivery by the one carried out. Only the backoff
strategies are called (their jitter draws random numbers; one that raises for a turned-away
delivery is logged).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..backoff import at_least
from ..backout.entry import Reason
from ..config import ResilienceConfig
from ..errors import BreakerOpen, BulkheadFull, TaskIdClaimed
from ..headers import TURNED_AWAY_HEADER, replays_of, request_count
from . import kept, turned_away
from .context import Options
from .ending import (
    AdmissionFailed,
    AlreadyDone,
    CeleryRaised,
    Claimed,
    Ending,
    KeptCopy,
    Limited,
    OwnError,
    ParkOn,
    Redelivered,
    Rejected,
    RetryAsked,
    Transient,
)

#: The shortest wait of a delivery that found its task id claimed (seconds): a claim about to
#: end is asked about again a moment later, not in a tight loop.
MIN_CLAIM_WAIT = 0.5


# -- what is known of the delivery ----------------------------------------------------------------
@dataclass(frozen=True)
class Facts:
    """What a fate depends on in the delivery being handled (its message, mostly)."""

    task_id: str
    retries: int = 0
    replays: int = 0
    eager: bool = False  # run by apply(): no broker to publish to or wait in
    failed_parks: int = 0  # a kept copy's count of parks the store refused (kept.py)
    turned_away: int = 0  # times in a row a full bulkhead turned it away (turned_away.py)

    @classmethod
    def of(cls, request: Any) -> Facts:
        return cls(
            task_id=request.id,
            retries=request.retries or 0,
            replays=replays_of(request),
            eager=bool(request.is_eager),
            failed_parks=kept.failed_parks(request),
            turned_away=request_count(request, TURNED_AWAY_HEADER),
        )


# -- fates --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Retry:
    """Published again, same id, in ``countdown`` s as attempt ``retries``; in eager mode,
    Celery's own retry runs it at once. The broker refusing it parks it (``delay_too_long``).
    ``spends``: a retry of a call that failed, which takes one retry from its breaker's retry
    budget first (:func:`budgeted`); a call turned away unrun spends none."""

    countdown: float
    retries: int
    cause: BaseException | None
    headers: Mapping[str, Any] = field(default_factory=dict)
    eager: bool = False
    spends: bool = False


@dataclass(frozen=True)
class Park:
    """Stored in the back-out store, due in ``due_in`` s; the message acked after that.
    The store refusing it keeps the message in the broker."""

    reason: Reason
    cause: kept.Cause
    due_in: float = 0.0


@dataclass(frozen=True)
class Keep:
    """Published again as it was (same id and retries) in ``delay`` s, because our side failed;
    ``headers`` make a kept copy of a park. The broker refusing it requeues the message."""

    delay: float
    cause: Exception
    headers: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Wait:
    """Published again as it was in ``delay`` s, acked with no state: another delivery of the
    task id runs it now. The broker refusing it keeps the message."""

    delay: float
    cause: TaskIdClaimed


@dataclass(frozen=True)
class Requeue:
    """Nothing could be published: the message goes back to the queue (or stays unacked)."""

    trouble: Exception
    cause: Exception


@dataclass(frozen=True)
class GiveUp:
    """``resilience_park_attempts`` parks failed: a person must redo the task (ERROR log line,
    counter, Celery FAILURE ``Unparkable``). Never silent, never an endless loop."""

    reason: Reason
    failed: int
    trouble: Exception


@dataclass(frozen=True)
class Skip:
    """Acked, not run: the task id already succeeded; or its dedup ``key`` did as task id
    ``of``, and this one ends as a duplicate (state ``DUPLICATE``)."""

    of: str = ""
    key: str = ""


@dataclass(frozen=True)
class Fail:
    """The exception goes to Celery: a FAILURE (the task's own error, or ours in eager mode
    where no broker can hold the message), or what the body's own Retry/Ignore/Reject say."""

    exc: BaseException


Fate = Retry | Park | Keep | Wait | Requeue | GiveUp | Skip | Fail


def decide(ending: Ending, facts: Facts, options: Options, config: ResilienceConfig) -> Fate:
    """The fate of a delivery after ``ending`` (the body ran, or was turned down)."""
    match ending:
        case KeptCopy(reason, cause):
            return Park(reason, cause)
        case AdmissionFailed(trouble):
            return Fail(trouble) if facts.eager else Keep(config.keep_delay, trouble)
        case AlreadyDone(of, key):
            return Skip(of, key)
        case Claimed(wait, key):
            claimed = TaskIdClaimed(facts.task_id, wait, key)
            if facts.eager:
                return Fail(claimed)
            # Until the claim could end, or keep_delay if sooner (a claim given back early, as
            # when its holder failed, is seen then), within what the broker holds safely.
            delay = min(max(wait, MIN_CLAIM_WAIT), config.keep_delay, config.max_countdown)
            return Wait(delay, claimed)
        case Redelivered():
            return Park("redelivered", None)
        case Rejected(error):
            if isinstance(error, BulkheadFull) and not facts.eager:  # busy, not down
                wait = _turned_away_wait(facts, options, config)
                headers = {TURNED_AWAY_HEADER: facts.turned_away + 1}
                return _retry_or_park(error, facts, options, config, wait, None, 0, headers)
            if options.on_open == "retry":
                return _retry_or_park(error, facts, options, config, error.retry_after)
            return Park("breaker_open", error)
        case Limited(error):
            if facts.eager:  # no broker to wait in, and an eager retry would run at once
                return Fail(error)
            # Over the rate: it waits in the broker for its slot, no attempt spent; a delivery
            # turned away again and again backs off as a full bulkhead's does (many copies
            # coming back for one slot would be a storm of sends). A slot past max_countdown is
            # asked for again after max_countdown: parked, its replays would be turned away in
            # turn until none is left.
            wait = max(error.retry_after, _turned_away_wait(facts, options, config))
            wait = min(wait, config.max_countdown)
            headers = {TURNED_AWAY_HEADER: facts.turned_away + 1}
            return _retry_or_park(error, facts, options, config, wait, None, 0, headers)
        case RetryAsked(cause, countdown, max_retries, _, least):
            fate = _retry_or_park(
                cause, facts, options, config, countdown, max_retries, least=least
            )
            return _spending(fate, options, config)
        case ParkOn(exc):
            return Park("park_on", exc, config.park_on_due_in(facts.replays))
        case Transient(exc, least):
            fate = _retry_or_park(exc, facts, options, config, least=least)
            return _spending(fate, options, config)
        case CeleryRaised(exc) | OwnError(exc):
            return Fail(exc)
    raise TypeError(f"not an ending: {ending!r}")


def budgeted(fate: Retry, granted: bool) -> Fate:
    """A spending retry (``Retry.spends``) once its breaker's retry budget answered: made if
    the budget ``granted`` it, else parked with reason ``retry_budget``, due when it would have
    run (the drain's replays spend the same budget)."""
    return fate if granted else Park("retry_budget", fate.cause, fate.countdown)


def _spending(fate: Fate, options: Options, config: ResilienceConfig) -> Fate:
    """A retry of a call through a breaker with a retry budget spends from it (never in eager
    mode: the retry runs at once, in the caller)."""
    if not isinstance(fate, Retry) or fate.eager or options.breaker is None:
        return fate
    if config.breaker(options.breaker).retry_budget is None:
        return fate
    return dataclasses.replace(fate, spends=True)


def instead(fate: Fate, trouble: Exception, facts: Facts, config: ResilienceConfig) -> Fate:
    """The next fate when carrying out ``fate`` failed with ``trouble``: the chain that keeps
    every message somewhere (retry -> park -> keep -> requeue; a claim's wait -> keep)."""
    match fate:
        case Retry(countdown=countdown, cause=cause):
            return Park("delay_too_long", cause, countdown)  # due when it would have run
        case Wait():
            return Keep(config.keep_delay, trouble)
        case Park(reason, cause):
            failed = facts.failed_parks + 1
            if failed >= config.park_attempts:
                return GiveUp(reason, failed, trouble)
            if facts.eager:
                return Fail(trouble)  # no broker to wait in: the caller sees the error
            delay = min(config.keep_delay * 2 ** (failed - 1), config.max_countdown)
            return Keep(delay, trouble, kept.headers(failed, reason, cause))
        case Keep(cause=cause):
            return Requeue(trouble, cause)
    raise TypeError(f"carrying out {fate!r} cannot fail") from trouble


def _retry_or_park(
    cause: BaseException | None,
    facts: Facts,
    options: Options,
    config: ResilienceConfig,
    delay: float | None = None,
    max_retries: int | None = None,  # the body's own retry(max_retries=...)
    spent: int = 1,  # 0: turned away unrun by a full bulkhead, no attempt used
    headers: Mapping[str, Any] | None = None,
    least: float | None = None,  # the failure's Retry-After: the countdown is never shorter
) -> Fate:
    retries = facts.retries
    limit = options.max_retries if max_retries is None else max_retries
    if spent and limit is not None and retries >= limit:
        reason: Reason = "breaker_open" if isinstance(cause, BreakerOpen) else "retries_exhausted"
        return Park(reason, cause, max(options.backoff(retries), least or 0.0))
    countdown = at_least(least, options.backoff(retries) if delay is None else delay)
    if countdown > config.max_countdown:
        # kombu redelivers ETA messages held past the visibility timeout: park instead.
        return Park("delay_too_long", cause, countdown)
    return Retry(countdown, retries + spent, cause, headers or {}, facts.eager)


def _turned_away_wait(facts: Facts, options: Options, config: ResilienceConfig) -> float:
    """How long a delivery a full bulkhead turned away waits (``turned_away.py``)."""
    cap = config.max_countdown
    if options.breaker is not None:
        cap = min(config.breaker(options.breaker).max_open_timeout, cap)
    attempts = max(facts.retries, options.max_retries or 0)
    return turned_away.next_wait(facts.turned_away, attempts, options.backoff, cap)
