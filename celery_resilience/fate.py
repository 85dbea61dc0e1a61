"""A delivery's fate, decided as a value: what becomes of a task's message, and what comes next
when carrying that out fails.

:func:`decide` maps how the call ended (``ending.py``: turned down at admission, or the body's
exception judged) to one fate: retry in N s, park with a reason and a due time, keep the message
in the broker, wait for another delivery of the task id, skip, or fail; :func:`fallback` maps a
fate whose carrying out failed to the next one (a retry the broker refused parks, a park the
store refused keeps the message, a kept copy the broker refused requeues it). No fate acks a
message that has nowhere else to be: that is the no-loss promise, and ``tests/test_fate.py``
holds these two functions to it as a table. No I/O here: ``carry_out.py`` performs a fate, the
task and the worker's time limit end the delivery by the one that held. Only the backoff
strategies are called (their jitter draws random numbers; one that raises for a turned-away
delivery is logged).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import kept, turned_away
from .backoff import BackoffStrategy
from .backout.entry import Reason
from .config import ResilienceConfig
from .ending import (
    AdmissionFailed,
    AlreadyDone,
    CeleryRaised,
    Claimed,
    Ending,
    KeptCopy,
    OwnError,
    ParkOn,
    Redelivered,
    Rejected,
    RetryAsked,
    Transient,
)
from .errors import BreakerOpen, BulkheadFull, TaskIdClaimed
from .headers import TURNED_AWAY_HEADER, replays_of, request_header

#: The shortest wait of a delivery that found its task id claimed (seconds): a claim about to
#: end is asked about again a moment later, not in a tight loop.
MIN_CLAIM_WAIT = 0.5


# -- what is known of the delivery and the task ---------------------------------------------------
@dataclass(frozen=True)
class Delivery:
    """What a fate depends on in the message being handled."""

    task_id: str
    retries: int = 0
    replays: int = 0
    eager: bool = False  # run by apply(): no broker to publish to or wait in
    failed_parks: int = 0  # a kept copy's count of parks the store refused (kept.py)
    turned_away: int = 0  # times in a row a full bulkhead turned it away (turned_away.py)

    @classmethod
    def of(cls, request: Any) -> Delivery:
        return cls(
            task_id=request.id,
            retries=request.retries or 0,
            replays=replays_of(request),
            eager=bool(request.is_eager),
            failed_parks=kept.failed_parks(request),
            turned_away=request_header(request, TURNED_AWAY_HEADER),
        )


@dataclass(frozen=True)
class Options:
    """The task options a fate depends on (``ResilientTask``'s class attributes)."""

    max_retries: int | None
    backoff: BackoffStrategy
    on_open: str = "park"
    breaker: str | None = None

    @classmethod
    def of(cls, task: Any) -> Options:
        return cls(task.max_retries, task.backoff, task.on_open, task.breaker)


# -- fates --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Retry:
    """Published again, same id, in ``countdown`` s as attempt ``retries``; in eager mode,
    Celery's own retry runs it at once. The broker refusing it parks it (``delay_too_long``)."""

    countdown: float
    retries: int
    cause: BaseException | None
    headers: Mapping[str, Any] = field(default_factory=dict)
    eager: bool = False


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
    """Acked, not run: the task id already succeeded."""


@dataclass(frozen=True)
class Fail:
    """The exception goes to Celery: a FAILURE (the task's own error, or ours in eager mode
    where no broker can hold the message), or what the body's own Retry/Ignore/Reject say."""

    exc: BaseException


Fate = Retry | Park | Keep | Wait | Requeue | GiveUp | Skip | Fail


def decide(ending: Ending, delivery: Delivery, options: Options, config: ResilienceConfig) -> Fate:
    """The fate of a delivery after ``ending`` (the body ran, or was turned down)."""
    match ending:
        case KeptCopy(reason, cause):
            return Park(reason, cause)
        case AdmissionFailed(trouble):
            return Fail(trouble) if delivery.eager else Keep(config.keep_delay, trouble)
        case AlreadyDone():
            return Skip()
        case Claimed(wait):
            claimed = TaskIdClaimed(delivery.task_id, wait)
            if delivery.eager:
                return Fail(claimed)
            # Until the claim could end, or keep_delay if sooner (a claim given back early, as
            # when its holder failed, is seen then), within what the broker holds safely.
            delay = min(max(wait, MIN_CLAIM_WAIT), config.keep_delay, config.max_countdown)
            return Wait(delay, claimed)
        case Redelivered():
            return Park("redelivered", None)
        case Rejected(error):
            if isinstance(error, BulkheadFull) and not delivery.eager:  # busy, not down
                wait = _turned_away_wait(delivery, options, config)
                headers = {TURNED_AWAY_HEADER: delivery.turned_away + 1}
                return _retry_or_park(error, delivery, options, config, wait, None, 0, headers)
            if options.on_open == "retry":
                return _retry_or_park(error, delivery, options, config, error.retry_after)
            return Park("breaker_open", error)
        case RetryAsked(cause, countdown, max_retries):
            return _retry_or_park(cause, delivery, options, config, countdown, max_retries)
        case ParkOn(exc):
            return Park("park_on", exc, config.park_on_due_in(delivery.replays))
        case Transient(exc):
            return _retry_or_park(exc, delivery, options, config)
        case CeleryRaised(exc) | OwnError(exc):
            return Fail(exc)
    raise TypeError(f"not an ending: {ending!r}")


def fallback(fate: Fate, trouble: Exception, delivery: Delivery, config: ResilienceConfig) -> Fate:
    """The next fate when carrying out ``fate`` failed with ``trouble``: the chain that keeps
    every message somewhere (retry -> park -> keep -> requeue; a claim's wait -> keep)."""
    match fate:
        case Retry(countdown=countdown, cause=cause):
            return Park("delay_too_long", cause, countdown)  # due when it would have run
        case Wait():
            return Keep(config.keep_delay, trouble)
        case Park(reason, cause):
            failed = delivery.failed_parks + 1
            if failed >= config.park_attempts:
                return GiveUp(reason, failed, trouble)
            if delivery.eager:
                return Fail(trouble)  # no broker to wait in: the caller sees the error
            delay = min(config.keep_delay * 2 ** (failed - 1), config.max_countdown)
            return Keep(delay, trouble, kept.headers(failed, reason, cause))
        case Keep(cause=cause):
            return Requeue(trouble, cause)
    raise TypeError(f"carrying out {fate!r} cannot fail") from trouble


def _retry_or_park(
    cause: BaseException | None,
    delivery: Delivery,
    options: Options,
    config: ResilienceConfig,
    delay: float | None = None,
    max_retries: int | None = None,  # the body's own retry(max_retries=...)
    spent: int = 1,  # 0: turned away unrun by a full bulkhead, no attempt used
    headers: Mapping[str, Any] | None = None,
) -> Fate:
    retries = delivery.retries
    limit = options.max_retries if max_retries is None else max_retries
    if spent and limit is not None and retries >= limit:
        reason: Reason = "breaker_open" if isinstance(cause, BreakerOpen) else "retries_exhausted"
        return Park(reason, cause, options.backoff(retries))
    countdown = options.backoff(retries) if delay is None else delay
    if countdown > config.max_countdown:
        # kombu redelivers ETA messages held past the visibility timeout: park instead.
        return Park("delay_too_long", cause, countdown)
    return Retry(countdown, retries + spent, cause, headers or {}, delivery.eager)


def _turned_away_wait(delivery: Delivery, options: Options, config: ResilienceConfig) -> float:
    """How long a delivery a full bulkhead turned away waits (``turned_away.py``)."""
    cap = config.max_countdown
    if options.breaker is not None:
        cap = min(config.breaker(options.breaker).max_open_timeout, cap)
    attempts = max(delivery.retries, options.max_retries or 0)
    return turned_away.next_wait(delivery.turned_away, attempts, options.backoff, cap)
