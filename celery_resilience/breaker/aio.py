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

A cancelled coroutine (``asyncio.CancelledError``) judges nothing: its permit is given back (a
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
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import BreakerOpen
from .knowledge import Knowledge
from .permit import Admission, Outcome, Permit


class Breaker(Protocol):
    """What this module uses of ``Breaker`` (a protocol: the facade imports this module)."""

    name: str
    _knowledge: Knowledge

    def admit(self) -> Admission: ...

    def _local_permit(self) -> Permit | None: ...

    def _defer(self, permit: Permit, outcome: Outcome) -> bool: ...

    def _record(self, permit: Permit, outcome: Outcome) -> None: ...


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


def _give_back(done: Future[Admission]) -> None:
    """The admission of a cancelled caller: its permit goes back, from a pool thread."""
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
        asked.add_done_callback(_give_back)  # it may have been granted meanwhile
        raise


async def acquire(breaker: Breaker) -> Permit:
    """A permit, or :class:`BreakerOpen`; Redis is asked off the event loop when it must be."""
    permit = breaker._local_permit()
    if permit is not None:
        return permit
    rejected = remembered(breaker)
    if rejected is not None:
        raise rejected
    sent = time.monotonic()
    admission = await _admit(breaker)
    if admission.rejected is not None:
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


async def settle(breaker: Breaker, permit: Permit, exc_type: type[BaseException] | None) -> None:
    """Report how the permitted block ended, waiting for Redis only off the event loop."""
    outcome = judge(permit, exc_type)
    if outcome == "release":
        if permit.kind != "probe":
            permit.release()  # nothing to send: marks the permit used
        elif exc_type is not None and not issubclass(exc_type, Exception):
            executor().submit(permit.release)  # cancelled: not awaited, it may be cancelled again
        else:
            await asyncio.wrap_future(executor().submit(permit.release))
        return
    if not permit._finish():
        return  # reported already, or Redis was down and fail_open let the call through
    if breaker._defer(permit, outcome):
        return
    await asyncio.wrap_future(executor().submit(breaker._record, permit, outcome))


class AsyncPermit:
    """``async with breaker.permit() as permit:`` runs the block only if the breaker admits it.

    An exception leaving the block counts as a failure unless the breaker's ``ignore`` lists its
    type; a success slower than ``slow_call_seconds`` counts as one too; a cancellation counts
    neither way. Made by ``Breaker.permit()``; one use per object. The block's end is the
    outcome: calling the permit's own ``success()`` or ``failure()`` inside it would wait for
    Redis on the event loop.
    """

    __slots__ = ("_breaker", "_permit")

    def __init__(self, breaker: Breaker) -> None:
        self._breaker = breaker
        self._permit: Permit | None = None

    async def __aenter__(self) -> Permit:
        self._permit = await acquire(self._breaker)
        return self._permit

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: object, tb: Any) -> None:
        permit, self._permit = self._permit, None
        if permit is not None:
            await settle(self._breaker, permit, exc_type)
