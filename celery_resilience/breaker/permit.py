"""A permit to make one call through a breaker, and ``Admission``, what admitting a delivery gave.

Split from the facade (``breaker.py``) because callers hold these without steering a breaker: a
task keeps its permit across the call and settles it afterwards. A permit only reports its outcome
once; the facade decides what that costs (a deferred count, or a round trip).
"""

from __future__ import annotations

import time
from typing import Literal, NamedTuple, Protocol

from ..backoff import retry_after
from ..config import BreakerConfig
from ..errors import BreakerOpen, RateLimited
from .types import Kind, Skip

#: How a permitted call ended: judged either way, or released unjudged.
Outcome = Literal["success", "failure", "release"]


class Recorder(Protocol):
    """The breaker a permit reports to (``Breaker``; a protocol, so this module stays below it)."""

    name: str
    config: BreakerConfig
    slow: float | None
    bulkhead: bool

    def _record(
        self, permit: Permit, outcome: Outcome, least_open: float | None = None
    ) -> None: ...


class Permit:
    """Leave to make one call; report its outcome with ``success()`` or ``failure()`` once.

    Usable as a context manager: an exception leaving the block is recorded as a failure
    unless the breaker's ``ignore`` option lists its type.
    """

    __slots__ = ("_done", "breaker", "kind", "permit_id", "started")

    def __init__(self, breaker: Recorder, kind: Kind | None, permit_id: str = "") -> None:
        self.breaker = breaker
        self.kind = kind  # None: Redis was down and fail_open let the call through unrecorded
        self.permit_id = permit_id  # a probe's lease; "" for a normal permit
        # Timed only where a slow call counts as a failure: a clock read less per call.
        self.started = time.monotonic() if breaker.slow is not None else 0.0
        self._done = False

    def success(self) -> None:
        """The call succeeded (a call slower than ``slow_call_seconds`` counts as a failure)."""
        if self._finish():
            slow = self.breaker.slow
            if slow is not None and time.monotonic() - self.started > slow:
                self.breaker._record(self, "failure")
            else:
                self.breaker._record(self, "success")

    def failure(self, retry_after: float | None = None) -> None:
        """The call failed: recorded at once (it may trip the breaker). ``retry_after``: the
        seconds the dependency asked for before the next call (a Retry-After): a trip by this
        failure keeps the breaker open at least that long."""
        if self._finish():
            self.breaker._record(self, "failure", retry_after)

    def release(self) -> None:
        """The call ended without judging the dependency (the caller's own error): nothing is
        counted, and a probe's half-open slot (and a bulkhead slot) is freed at once."""
        if self._finish() and self.leased:
            self.breaker._record(self, "release")

    @property
    def leased(self) -> bool:
        """Whether Redis keeps a lease of this permit that releasing it frees: a probe's, a
        bulkhead slot's."""
        return self.kind == "probe" or self.breaker.bulkhead

    def _finish(self) -> bool:
        done, self._done = self._done, True
        return not done and self.kind is not None

    def __enter__(self) -> Permit:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: object, tb: object) -> None:
        if exc_type is None:
            self.success()
        elif not issubclass(exc_type, Exception):
            # KeyboardInterrupt, SystemExit: the process is going, the dependency not judged.
            self._done = True
        elif not issubclass(exc_type, self.breaker.config.ignore):
            said = retry_after(exc, time.time()) if isinstance(exc, BaseException) else None
            self.failure(said)
        else:
            self.release()  # ignored: counted neither way; a probe frees its slot


class Admission(NamedTuple):
    """What ``Breaker.admit`` decided: a permit, or why not; and the delivery answers.

    A named tuple: one is made for every task delivery."""

    permit: Permit | None
    rejected: BreakerOpen | RateLimited | None
    deliveries: int = 0
    skip: Skip = ""
    #: The token this delivery claimed its task id under (``deduplicate``), ``""`` if none.
    claim: str = ""
    #: With skip ``claimed``: seconds until the claim another delivery holds ends.
    wait: float = 0.0
