"""A fallback for ``Breaker.call`` and ``acall``: the value a refused call returns instead of
raising.

A fallback is a callable given the refusal (a :class:`~celery_resilience.BreakerOpen`, or a
subclass such as ``BulkheadFull``, or a :class:`~celery_resilience.RateLimited`), as
Resilience4j's ``withFallback`` and Polly's fallback action are given what went wrong: the
refusal says which breaker, why and for how long (``retry_after``), which is all a fallback may
need that its caller does not already hold. The call's own arguments are not passed
(``circuitbreaker``'s convention): they are in the caller's closure anyway, and one fallback
then serves functions of any signature.

Only a refusal falls back: the dependency was not called. A failure of the call itself is
recorded and raised, as without a fallback. Each fallback is counted
(``celery_resilience_breaker_fallbacks_total{breaker,reason}``); the counts are sent to Redis
from a pool thread, many per round trip, never on the caller's path. It is logged at DEBUG,
but for the first of an outage, at INFO (:class:`FallbackLog`): an open breaker answers every
call it refuses, and a line each would bury the one that says what is going on.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

from ..errors import BreakerOpen, BulkheadFull, RateLimited, ResilienceError
from ..redact import get_logger
from ..trouble import TroubleLog

logger = get_logger("celery_resilience.breaker")

#: What ``fallback=`` takes: a callable given the refusal, returning the call's value (for
#: ``acall``, an awaitable of it may be returned too).
Fallback = Callable[[Any], Any]
#: Counts a fallback of (breaker, reason).
Counter = Callable[[str, str], None]


def check(fallback: object) -> None:
    """A fallback must be callable. A value that is not most likely meant ``fn``'s own keyword
    argument named ``fallback``, which ``call`` takes for itself: say so rather than guess."""
    if not callable(fallback):
        raise TypeError(
            f"fallback={fallback!r} is not callable: Breaker.call's fallback is a callable given "
            "the refusal (fallback=lambda refusal: value); to pass the called function its own "
            "argument named 'fallback', wrap it (functools.partial(fn, fallback=...))"
        )


def reason(refusal: ResilienceError) -> str:
    """Why the breaker refused, as the metric's ``reason`` label says it."""
    if isinstance(refusal, RateLimited):
        return "rate_limited"
    assert isinstance(refusal, BreakerOpen)  # errors.REFUSALS
    if isinstance(refusal, BulkheadFull):
        return "bulkhead_full"
    if refusal.state == "unavailable":  # Redis unreachable, resilience_on_redis_error fail_closed
        return "unavailable"
    return "breaker_open"


class FallbackLog:
    """One breaker's fallback lines, once per outage as ``TroubleLog`` logs a failure: the first
    fallback since the breaker last admitted a call at INFO, the others at DEBUG, and the next
    call it admits says at INFO how many fell back meanwhile."""

    def __init__(self, breaker: str) -> None:
        self.breaker = breaker
        self._trouble = TroubleLog(logger, f"fallbacks of breaker {breaker!r}", by_cause=False)

    def fell_back(self, refusal: ResilienceError) -> None:
        why = reason(refusal)
        if self._trouble.first(refusal):
            logger.info(
                "Breaker %r refuses calls (%s): %s; their fallback answers them (each further "
                "fallback is logged at DEBUG until the breaker admits a call)",
                self.breaker,
                why,
                refusal,
            )
        else:
            logger.debug(
                "Breaker %r refused a call (%s): %s; fallback used", self.breaker, why, refusal
            )

    def admitted(self) -> None:
        """The breaker admitted a call: an outage of fallbacks, if one ran, is over. Free while
        none ran: it is called on every admitted call."""
        fell_back = self._trouble.recovered()
        if fell_back:
            logger.info(
                "Breaker %r admits calls again: %d call(s) fell back meanwhile",
                self.breaker,
                fell_back,
            )


def announce(refusal: ResilienceError, log: FallbackLog, count: Counter | None) -> None:
    """Log and count one fallback (the caller then calls it)."""
    assert isinstance(refusal, (BreakerOpen, RateLimited))  # errors.REFUSALS
    why, breaker = reason(refusal), refusal.breaker
    log.fell_back(refusal)
    if count is not None:
        try:
            count(breaker, why)
        except Exception:  # a metric never changes what the caller gets
            logger.debug("Could not count a fallback", exc_info=True)


#: Every tally of this process, for a forked child to give each a lock of its own.
_every: weakref.WeakSet[FallbackTally] = weakref.WeakSet()


def _forked() -> None:
    # A fork copies a lock as the parent's threads left it: one a counting thread held at that
    # moment would stay held in the child, and its first fallback would wait forever.
    for tally in list(_every):
        tally._lock = threading.Lock()


os.register_at_fork(after_in_child=_forked)


class FallbackTally:
    """Fallbacks counted in this process and sent with ``send`` (a store's ``bump``) from a pool
    thread: at most one send under way, which takes every count made meanwhile, so a storm of
    fallbacks costs a round trip per send, not per fallback. Counts a send could not deliver
    (Redis away) are dropped with a DEBUG line: a metric, never the caller's outcome."""

    def __init__(
        self,
        send: Callable[[dict[str, float]], None],
        scope: Callable[[str], str] = lambda name: name,
        submit: Callable[[Callable[[], None]], object] | None = None,
    ) -> None:
        self._send = send
        self._scope = scope  # a derived breaker counts under its family (<base>:*)
        self._submit = submit
        self._lock = threading.Lock()
        self._held: dict[str, float] = {}
        self._sending = False
        self._pid = os.getpid()
        _every.add(self)

    def count(self, breaker: str, why: str) -> None:
        name = f"fallbacks|{self._scope(breaker)}|{why}"
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's send is not its own
                self._pid, self._held, self._sending = os.getpid(), {}, False
            self._held[name] = self._held.get(name, 0.0) + 1
            if self._sending:
                return
            self._sending = True
        self._start()

    def _start(self) -> None:
        if self._submit is not None:
            self._submit(self._flush)
            return
        from .aio import executor  # the process's pool for breaker round trips

        executor().submit(self._flush)

    def _flush(self) -> None:
        with self._lock:
            held, self._held = self._held, {}
        try:
            self._send(held)
        except Exception:
            logger.debug("Could not send %d fallback counts", len(held), exc_info=True)
        with self._lock:
            again = bool(self._held)
            self._sending = again
        if again:  # counted while this send was under way
            self._start()
