"""The breaker for asyncio callers: ``async with breaker.permit():`` and ``await breaker.acall()``.

The same protocol and the same shared state as ``Breaker.call``; only the waiting differs. A call
the process may admit alone (a closed breaker, known for sure: ``knowledge.py``) and a success it
may count alone cost no round trip and never leave the event loop. Anything that needs Redis (an
open, half-open or streaking breaker, a failure, a due flush) runs the breaker's own synchronous
code in a small thread pool of the process, and the coroutine awaits it. Chosen over
``redis.asyncio`` because one code path keeps one semantics: the same scripts, client, error policy,
knowledge and deployments (one server, Sentinel, Cluster), and no connection pool bound to one event
loop (a Django async view may run on a new loop per request; ``asyncio.run`` in tests does).

An open breaker rejects without a round trip too, once the process was told how long it stays
open: until that time passes (measured from when the question was sent, so never later than
Redis's ``open_until``), while the change feed reports no change of the breaker.

A cancelled coroutine (``asyncio.CancelledError``) judges nothing: its permit is released (a
probe's half-open slot freed at once), also when the cancellation arrives while Redis is still
being asked for the permit.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from ..backoff import retry_after
from ..errors import BreakerOpen
from .knowledge import Knowledge
from .permit import Admission, Outcome, Permit


class Breaker(Protocol):
    """What this module uses of ``Breaker`` (a protocol: the facade imports this module)."""

    name: str
    _knowledge: Knowledge

    def admit(self) -> Admission: ...

    def _quick_permit(self) -> Permit | None: ...

    def _defer(self, permit: Permit, outcome: Outcome) -> bool: ...

    def _record(
        self, permit: Permit, outcome: Outcome, least_open: float | None = None
    ) -> None: ...

    def _family_refresh_due(self) -> bool: ...

    def refresh_family(self, generation: int | None = None) -> None: ...


#: Threads asking Redis for asyncio callers, per process: enough for a burst of round trips on
#: an open or half-open breaker; a hanging Redis holds each for at most the client's timeout.
THREADS = 8
#: States an open-breaker rejection may be remembered in.
_REJECTING = frozenset({"open", "forced_open"})

_pool: tuple[int, ThreadPoolExecutor] | None = None
_pool_lock = threading.Lock()


def executor() -> ThreadPoolExecutor:
    """This process's pool (a forked child makes its own: the parent's threads are not in it)."""
    global _pool  # noqa: PLW0603 - one pool per process, made on first use
    pool = _pool
    if pool is None or pool[0] != os.getpid():
        with _pool_lock:
            pool = _pool
            if pool is None or pool[0] != os.getpid():
                made = ThreadPoolExecutor(THREADS, thread_name_prefix="celery-resilience-aio")
                pool = _pool = (os.getpid(), made)
    return pool[1]


@dataclass(frozen=True, slots=True)
class _Rejection:
    """An open breaker as last heard: rejected until ``until`` (monotonic) in this view."""

    version: int
    generation: int
    until: float


_rejections: weakref.WeakKeyDictionary[Breaker, _Rejection] = weakref.WeakKeyDictionary()


def remembered(breaker: Breaker) -> BreakerOpen | None:
    """The rejection of an open breaker, while it is sure to still hold; else ``None``."""
    memo = _rejections.get(breaker)
    if memo is None:
        return None
    view = breaker._knowledge.known(breaker.name)
    left = memo.until - time.monotonic()
    if view is None or (view.version, view.generation) != (memo.version, memo.generation):
        return None  # the breaker changed, or a change may have been missed
    if left <= 0 or view.state not in _REJECTING:
        return None
    return BreakerOpen(breaker.name, view.state, None if math.isinf(left) else left)


def remember(breaker: Breaker, rejected: BreakerOpen, sent: float) -> None:
    """Keep an open breaker's rejection (asked at ``sent``) for the calls that follow."""
    view = breaker._knowledge.known(breaker.name)
    if view is None or view.state not in _REJECTING or view.state != rejected.state:
        return
    # forced_open has no end: it holds until the feed reports the operator's next order.
    until = math.inf if rejected.retry_after is None else sent + rejected.retry_after
    _rejections[breaker] = _Rejection(view.version, view.generation, until)


def _release(done: Future[Admission]) -> None:
    """The admission of a cancelled caller: its permit released, from a pool thread."""
    if done.cancelled() or done.exception() is not None:
        return
    permit = done.result().permit
    if permit is not None:
        executor().submit(permit.release)


async def _admit(breaker: Breaker) -> Admission:
    asked = executor().submit(breaker.admit)
    try:
        return await asyncio.wrap_future(asked)
    except asyncio.CancelledError:
        asked.add_done_callback(_release)  # it may have been granted meanwhile
        raise


async def acquire(breaker: Breaker) -> Permit:
    """A permit, or :class:`BreakerOpen` (:class:`RateLimited` over the breaker's rate limit);
    Redis is asked off the event loop when it must be."""
    permit = breaker._quick_permit()
    if permit is not None:
        return permit
    rejected = remembered(breaker)
    if rejected is not None:
        raise rejected
    sent = time.monotonic()
    admission = await _admit(breaker)
    if admission.rejected is not None:
        if isinstance(admission.rejected, BreakerOpen):
            remember(breaker, admission.rejected, sent)
        raise admission.rejected
    assert admission.permit is not None
    return admission.permit


def judge(permit: Permit, exc_type: type[BaseException] | None) -> Outcome:
    """What the block's end says of the dependency, as ``Permit.__exit__`` judges it, except
    that a cancellation (or any exit that is no ``Exception``) gives the permit back."""
    if exc_type is None:
        slow = permit.breaker.slow
        too_slow = slow is not None and time.monotonic() - permit.started > slow
        return "failure" if too_slow else "success"
    if not issubclass(exc_type, Exception) or issubclass(exc_type, permit.breaker.config.ignore):
        return "release"
    return "failure"


async def settle(
    breaker: Breaker,
    permit: Permit,
    exc_type: type[BaseException] | None,
    least_open: float | None = None,
) -> None:
    """Report how the permitted block ended. Only what needs no round trip happens on the event
    loop; anything sent to Redis (a failure, a success that must be recorded, a probe's lease
    or a bulkhead slot released, a family's refresh) goes through the process's pool, awaited
    unless the caller was cancelled (it may be cancelled again)."""
    outcome = judge(permit, exc_type)
    work: Callable[[], None]
    if outcome == "release":
        if not permit.leased:
            permit.release()  # no lease to free: this marks the permit used
            return
        work = permit.release
    elif not permit._finish():
        return  # reported already, or Redis was down and fail_open let the call through
    elif breaker._defer(permit, outcome):  # counted in the process
        if not breaker._family_refresh_due():
            return
        work = breaker.refresh_family
    else:
        work = partial(breaker._record, permit, outcome, least_open)
    sent = executor().submit(work)
    if exc_type is None or issubclass(exc_type, Exception):
        await asyncio.wrap_future(sent)


class AsyncPermit:
    """``async with breaker.permit() as permit:`` runs the block only if the breaker admits it.

    An exception leaving the block counts as a failure unless the breaker's ``ignore`` lists its
    type; a success slower than ``slow_call_seconds`` counts as one too; a cancellation counts
    neither way. Made by ``Breaker.permit()``; one use per object. The block's end is the
    outcome: calling the permit's own ``success()`` or ``failure()`` inside it would wait for
    Redis on the event loop. ``granted``: a permit already acquired (``acall`` with a fallback
    acquires first, so that only the breaker's own refusal falls back).
    """

    __slots__ = ("_breaker", "_granted", "_permit")

    def __init__(self, breaker: Breaker, granted: Permit | None = None) -> None:
        self._breaker = breaker
        self._granted = granted
        self._permit: Permit | None = None

    async def __aenter__(self) -> Permit:
        granted, self._granted = self._granted, None
        self._permit = granted if granted is not None else await acquire(self._breaker)
        return self._permit

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: object, tb: Any) -> None:
        permit, self._permit = self._permit, None
        if permit is not None:
            least = retry_after(exc, time.time()) if isinstance(exc, BaseException) else None
            await settle(self._breaker, permit, exc_type, least)
