"""A breaker's ``rate_limit`` in one process: calls leased from the fleet's rate in batches.

The fleet's rate lives in Redis (``lua/rate.lua``, a GCRA on Redis time). Asking it for every
call would cost a round trip per call, so a process leases a *batch* of calls at a time, sized to
cover at most :data:`LEASE_SECONDS` of the fleet's rate, and spends it here, under a lock. The
bucket holds one batch, so over any stretch of time the fleet makes at most
``rate x elapsed + batch x (processes + 1)`` calls: each process may hold one batch it has not
spent yet, and the bucket one more. A refusal is remembered until the rate could grant the next
batch: calls turned away meanwhile cost no round trip, and are counted with the next lease.

One thread of a process asks at a time. When its ask fails (Redis unreachable), the threads
that waited for it get the same error rather than ask again one after another: on a Redis that
hangs, every caller waits about one client timeout, not one more per thread ahead of it.

Bookkeeping only: :class:`RateLease` never talks to Redis itself; the breaker hands it the
one call that does (:meth:`RateLease.take_or_lease`).
"""

from __future__ import annotations

import math
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Final

from .knowledge import forks
from .types import US

#: A batch covers at most this much of the fleet's rate (seconds): the bound above stays small
#: against one second of the rate, and at high rates a round trip buys many calls.
LEASE_SECONDS: Final = 0.1
#: :meth:`RateLease.take`'s answer when this process has no call left and must ask Redis.
ASK: Final = -1.0


#: Every lease of this process, for a forked child to give each locks of its own.
_every: weakref.WeakSet[RateLease] = weakref.WeakSet()


def _forked() -> None:
    # A fork copies a lock as the parent's threads left it: ``asking`` held by a thread waiting
    # on Redis would stay held in the child, which has no such thread to release it, and its
    # first call over the lease would wait forever.
    for lease in list(_every):
        lease._lock = threading.Lock()
        lease.asking = threading.Lock()


os.register_at_fork(after_in_child=_forked)


def batch_size(per_second: float) -> int:
    """Calls one lease takes: ``LEASE_SECONDS`` of the rate, at least one."""
    return max(1, math.floor(per_second * LEASE_SECONDS))


class RateLease:
    """The calls this process leased from its breaker's fleet-wide rate and has not spent yet.

    Thread-safe; a forked child starts with none (its parent keeps what it leased) and with
    locks of its own.
    """

    def __init__(self, per_second: float) -> None:
        self.batch = batch_size(per_second)
        #: The time the fleet's rate takes to earn one batch, as the script receives it.
        self.span_us = max(1, round(self.batch * US / per_second))
        #: The bucket holds one batch: a process may start with a full lease at once.
        self.burst_us = self.span_us
        self._lock = threading.Lock()
        self._left = 0
        self._refused_until = 0.0  # monotonic: no batch before then, as Redis last said
        self._refused = 0  # calls turned away here, not yet counted in Redis
        self._forks = forks()
        #: Held by the one thread of the process that asks Redis for a batch: the others wait
        #: for its answer rather than lease a batch each.
        self.asking = threading.Lock()
        #: Asks that failed so far, and the error of the last: a thread that waited for an ask
        #: which failed raises its error instead of asking again.
        self._failures = 0
        self._failure: Exception | None = None
        _every.add(self)

    def take(self) -> float:
        """Spend one leased call: ``0.0`` if there was one; else :data:`ASK` (lease a batch,
        then :meth:`granted` or :meth:`refused`), or the seconds until the next batch could be
        granted, as Redis last said (the call is turned away, and counted)."""
        with self._lock:
            self._forget_inherited()
            if self._left > 0:
                self._left -= 1
                return 0.0
            wait = self._refused_until - time.monotonic()
            if wait > 0:  # spent, and Redis would grant no batch before then
                self._refused += 1
                return wait
            return ASK

    def take_or_lease(self, lease: Callable[[int], int]) -> float:
        """:meth:`take`, asking for a batch when the process has none: ``0.0`` if a call was
        taken, else the seconds until the next batch could be granted. ``lease(refused)`` asks
        Redis for a batch, counting ``refused`` calls, and returns the microseconds until one
        (0: granted). One thread asks at a time; the others spend what it got, or raise the error
        it met."""
        wait = self.take()
        if wait != ASK:
            return wait
        failures = self._failures
        with self.asking:
            failure = self._failure
            if self._failures != failures and failure is not None:
                raise failure  # the ask this thread waited for failed: its answer is this one's
            wait = self.take()
            if wait != ASK:
                return wait
            reported = self.reported()
            sent = time.monotonic()
            try:
                wait_us = lease(reported)
            except Exception as exc:
                self.unreported(reported)
                self._failure, self._failures = exc, self._failures + 1
                raise
            except BaseException:
                self.unreported(reported)
                raise
            if wait_us == 0:
                self.granted(sent)
                return 0.0
            return self.refused(wait_us)

    def give_back(self) -> None:
        """A call taken but not made (the breaker turned it down): spent later, here."""
        with self._lock:
            self._forget_inherited()
            self._left = min(self._left + 1, self.batch)

    def reported(self) -> int:
        """The refusals to count with the lease being asked for, taken from the tally
        (:meth:`unreported` puts them back if the lease never reached Redis)."""
        with self._lock:
            self._forget_inherited()
            refused, self._refused = self._refused, 0
            return refused

    def unreported(self, refused: int) -> None:
        with self._lock:
            self._refused += refused

    def granted(self, sent: float) -> None:
        """Redis granted a batch asked for at ``sent`` (monotonic): the call that asked takes
        one, the rest are spent here. The grant moved the fleet's rate on by a batch from no
        earlier than ``sent``, so no next batch comes before ``sent`` + the span (less what
        the bucket holds beyond one batch): a process that spends its batch sooner turns calls
        away until then without asking (one round trip a batch, not two, at saturation)."""
        with self._lock:
            self._left += self.batch - 1
            self._refused_until = sent + max(0, 2 * self.span_us - self.burst_us) / US

    def refused(self, wait_us: int) -> float:
        """Redis refused a batch for ``wait_us`` more: remembered, and the asking call counted
        with the next lease. Returns the wait in seconds (> 0)."""
        wait = max(wait_us, 1) / US
        with self._lock:
            self._refused_until = time.monotonic() + wait
            self._refused += 1
        return wait

    def _forget_inherited(self) -> None:
        if self._forks != forks():
            self._forks, self._left, self._refused_until, self._refused = forks(), 0, 0.0, 0
