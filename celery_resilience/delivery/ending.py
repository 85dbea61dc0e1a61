"""How a delivery's call ended short of a success, as a value: turned down at admission, or the
body's exception judged.

What ``fate.decide`` takes. A body's ending carries the breaker's ``outcome`` of the call
(``settle.py``): a transient error or a time limit is a failure; ``park_on`` and Celery's own
``Retry``/``Ignore``/``Reject`` say the dependency answered (a success); the task's own error
judges nothing (the permit is released).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

from celery.exceptions import Ignore, Reject, Retry, SoftTimeLimitExceeded

from ..backoff import retry_after
from ..backout.entry import Reason
from ..breaker.permit import Admission, Outcome
from ..errors import BreakerOpen, RateLimited
from . import kept
from .body_retry import BodyRetry


@dataclass(frozen=True)
class KeptCopy:
    """A kept copy of a park the store refused (``kept.py``): parked, its body not run."""

    reason: Reason
    cause: kept.Cause


@dataclass(frozen=True)
class AdmissionFailed:
    """Our own machinery failed before the body ran."""

    trouble: Exception


@dataclass(frozen=True)
class AlreadyDone:
    """``deduplicate``: the task id already succeeded; or its dedup ``key`` did, as task id
    ``of`` (another: this one is a duplicate)."""

    of: str = ""
    key: str = ""


@dataclass(frozen=True)
class Claimed:
    """``deduplicate``: another delivery runs the task id (or holds its dedup ``key``) now, its
    claim ends in ``wait`` s."""

    wait: float
    key: str = ""


@dataclass(frozen=True)
class Redelivered:
    """The broker delivered the message too often (a crash loop): it is not run again."""


@dataclass(frozen=True)
class Rejected:
    """The breaker did not admit the call: open, or its bulkhead full."""

    error: BreakerOpen


@dataclass(frozen=True)
class Limited:
    """The breaker's ``rate_limit`` turned the call away: the dependency was not called."""

    error: RateLimited


@dataclass(frozen=True)
class RetryAsked:
    """The body's own ``self.retry()`` / ``autoretry_for`` (``body_retry.py``)."""

    cause: BaseException | None
    countdown: float | None = None  # None: the task's backoff
    max_retries: int | None = None  # None: the task's own
    outcome: Outcome = "success"  # a failure when the cause is transient
    retry_after: float | None = None  # what the cause said of its retry (Retry-After), seconds


@dataclass(frozen=True)
class CeleryRaised:
    """The body raised Celery's own ``Retry``, ``Ignore`` or ``Reject``."""

    exc: BaseException
    outcome: ClassVar[Outcome] = "success"


@dataclass(frozen=True)
class ParkOn:
    """A ``park_on`` exception: the dependency is up and said "not now"."""

    exc: BaseException
    outcome: ClassVar[Outcome] = "success"


@dataclass(frozen=True)
class Transient:
    """A ``retry_on`` exception, or a time limit: the dependency failed or hung.
    ``retry_after``: the least wait it asked for (its ``retry_after``, a Retry-After header)."""

    exc: BaseException
    retry_after: float | None = None
    outcome: ClassVar[Outcome] = "failure"


@dataclass(frozen=True)
class OwnError:
    """Any other exception: the task's own failure (a bug, bad input), the dependency unjudged."""

    exc: BaseException
    outcome: ClassVar[Outcome] = "release"


TurnedDown = KeptCopy | AdmissionFailed | AlreadyDone | Claimed | Redelivered | Rejected | Limited
BodyEnded = RetryAsked | CeleryRaised | ParkOn | Transient | OwnError
Ending = TurnedDown | BodyEnded


def turned_down(admission: Admission) -> TurnedDown | None:
    """Why the admission did not let the body run; ``None``: it runs."""
    if admission.skip == "done":
        return AlreadyDone()
    if admission.skip == "claimed":
        return Claimed(admission.wait)
    if admission.skip == "redelivered":
        return Redelivered()
    if isinstance(admission.rejected, RateLimited):
        return Limited(admission.rejected)
    if admission.rejected is not None:
        return Rejected(admission.rejected)
    return None


def body_ended(
    exc: BaseException,
    retry_on: tuple[type[BaseException], ...],
    park_on: tuple[type[BaseException], ...],
) -> BodyEnded | None:
    """How the body's exception is judged, first match winning; ``None``: not ours to judge
    (a ``BaseException`` such as ``SystemExit``), it leaves the task untouched. What a failure
    says of its retry (Retry-After) is read here, against this process's clock (a date in a
    header is the dependency's own clock anyway)."""
    transient = (*retry_on, SoftTimeLimitExceeded)  # a soft time limit: the call hung
    if isinstance(exc, BodyRetry):
        outcome: Outcome = "failure" if isinstance(exc.exc, transient) else "success"
        said = retry_after(exc.exc, time.time())
        return RetryAsked(exc.exc, exc.countdown, exc.max_retries, outcome, said)
    if isinstance(exc, (Retry, Ignore, Reject)):
        return CeleryRaised(exc)
    if isinstance(exc, park_on):
        return ParkOn(exc)
    if isinstance(exc, transient):
        return Transient(exc, retry_after(exc, time.time()))
    if isinstance(exc, Exception):
        return OwnError(exc)
    return None
