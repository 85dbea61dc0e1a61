"""How a delivery's call ended short of a success, as a value: turned down at admission, or the
body's exception judged.

What ``fate.decide`` takes. A body's ending carries the breaker's ``outcome`` of the call
(``settle.py``): a transient error or a time limit is a failure; ``park_on`` and Celery's own
``Retry``/``Ignore``/``Reject`` say the dependency answered (a success); the task's own error
judges nothing (the permit is released).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from celery.exceptions import Ignore, Reject, Retry, SoftTimeLimitExceeded

from . import kept
from .backout.entry import Reason
from .body_retry import BodyRetry
from .breaker.permit import Admission, Outcome
from .errors import BreakerOpen


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
    """``deduplicate``: the task id already succeeded."""


@dataclass(frozen=True)
class Claimed:
    """``deduplicate``: another delivery runs the task id now, its claim ends in ``wait`` s."""

    wait: float


@dataclass(frozen=True)
class Redelivered:
    """The broker delivered the message too often (a crash loop): it is not run again."""


@dataclass(frozen=True)
class Rejected:
    """The breaker did not admit the call: open, or its bulkhead full."""

    error: BreakerOpen


@dataclass(frozen=True)
class RetryAsked:
    """The body's own ``self.retry()`` / ``autoretry_for`` (``body_retry.py``)."""

    cause: BaseException | None
    countdown: float | None = None  # None: the task's backoff
    max_retries: int | None = None  # None: the task's own
    outcome: Outcome = "success"  # a failure when the cause is transient


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
    """A ``retry_on`` exception, or a time limit: the dependency failed or hung."""

    exc: BaseException
    outcome: ClassVar[Outcome] = "failure"


@dataclass(frozen=True)
class OwnError:
    """Any other exception: the task's own failure (a bug, bad input), the dependency unjudged."""

    exc: BaseException
    outcome: ClassVar[Outcome] = "release"


TurnedDown = KeptCopy | AdmissionFailed | AlreadyDone | Claimed | Redelivered | Rejected
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
    if admission.rejected is not None:
        return Rejected(admission.rejected)
    return None


def body_ended(
    exc: BaseException,
    retry_on: tuple[type[BaseException], ...],
    park_on: tuple[type[BaseException], ...],
) -> BodyEnded | None:
    """How the body's exception is judged, first match winning; ``None``: not ours to judge
    (a ``BaseException`` such as ``SystemExit``), it leaves the task untouched."""
    transient = (*retry_on, SoftTimeLimitExceeded)  # a soft time limit: the call hung
    if isinstance(exc, BodyRetry):
        outcome: Outcome = "failure" if isinstance(exc.exc, transient) else "success"
        return RetryAsked(exc.exc, exc.countdown, exc.max_retries, outcome)
    if isinstance(exc, (Retry, Ignore, Reject)):
        return CeleryRaised(exc)
    if isinstance(exc, park_on):
        return ParkOn(exc)
    if isinstance(exc, transient):
        return Transient(exc)
    if isinstance(exc, Exception):
        return OwnError(exc)
    return None
