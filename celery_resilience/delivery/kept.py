"""A kept copy: the message a task publishes again when the back-out store refused its park.

Its headers say that the body already ran (or must not run) and why the task was being parked,
so its next delivery goes straight to parking. Each failed attempt waits longer in the broker
(``resilience_keep_delay``, doubling, at most ``resilience_max_countdown``); after
``resilience_park_attempts`` failed parks the task gives up where a person sees it: an ERROR
log line with the task, the ``celery_resilience_unparkable_total`` counter and a Celery FAILURE
(:class:`~celery_resilience.errors.Unparkable`) in the result backend. Never a silent drop,
never an endless loop. ``fate.py`` decides which; this module reads and writes the headers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from ..backout.entry import REASONS, Reason
from ..backout.summary import call
from ..errors import Unparkable
from ..headers import request_header
from ..known_tasks import masking_of
from ..redact import get_logger
from .context import Delivery

logger = get_logger("celery_resilience.park")
#: What a task gave for parking: the exception, or its (type, message) from a kept copy.
Cause = BaseException | tuple[str, str] | None

#: Message header: the number of parks that failed for this task so far (absent: none).
KEPT_HEADER = "resilience_kept"
#: Message header: the reason the task was being parked.
KEPT_REASON_HEADER = "resilience_kept_reason"
#: Message header: ``"<exception type>: <message>"`` of the cause, for the entry.
KEPT_ERROR_HEADER = "resilience_kept_error"


def failed_parks(request: Any) -> int:
    """How many parks failed before this delivery (0: not a kept copy of a park)."""
    try:
        return max(0, int(request_header(request, KEPT_HEADER) or 0))
    except (TypeError, ValueError):
        return 0


def kept_park(request: Any) -> tuple[Reason, str, str] | None:
    """``(reason, exc_type, exc_message)`` when this delivery is a kept copy of a park that
    must not run the body. A copy of a ``breaker_open`` park never ran it: the breaker decides
    again (it parks the copy while open, runs it once closed), its failed parks still counted."""
    if not failed_parks(request):
        return None
    reason = str(request_header(request, KEPT_REASON_HEADER) or "")
    if reason == "breaker_open":
        return None
    if reason not in REASONS:
        reason = "retries_exhausted"  # a header mangled on the way: still parked, never run
    exc_type, _, exc_message = str(request_header(request, KEPT_ERROR_HEADER) or "").partition(": ")
    return cast(Reason, reason), exc_type, exc_message


def headers(failed: int, reason: Reason, exc: Cause) -> dict[str, Any]:
    """The headers of the kept copy after ``failed`` refused parks (``fate.instead`` decides
    whether there is one, and its delay)."""
    if isinstance(exc, BaseException):
        error = f"{_qualname(type(exc))}: {exc}"
    else:
        error = ": ".join(exc or ())
    return {KEPT_HEADER: failed, KEPT_REASON_HEADER: reason, KEPT_ERROR_HEADER: error}


def without_kept(headers: Mapping[str, Any]) -> dict[str, Any]:
    """Headers of an entry parked from a kept copy: its replay is a normal delivery again."""
    drop = (KEPT_HEADER, KEPT_REASON_HEADER, KEPT_ERROR_HEADER)
    return {k: v for k, v in headers.items() if k not in drop}


def give_up(delivery: Delivery, reason: Reason, failed: int, trouble: BaseException) -> None:
    """Every park attempt failed: an ERROR log line with what a person needs to redo the task,
    and the counter. The caller ends the delivery with :func:`unparkable` (a Celery FAILURE: the
    message is acked, it has nowhere else to go)."""
    name, request, runtime = delivery.task.name, delivery.request, delivery.runtime
    shown = call(
        name,
        request.args,
        request.kwargs,
        getattr(request, "argsrepr", None),
        getattr(request, "kwargsrepr", None),
        masking_of(runtime),
    )
    logger.error(
        "Gave up parking %s[%s] after %d failed parks (reason %s, last error %s: %s); "
        "called with (%s): the task must be redone by hand",
        name,
        request.id,
        failed,
        reason,
        type(trouble).__name__,
        trouble,
        shown,
    )
    try:
        runtime.backout_store.bump({f"unparkable|{delivery.options.breaker or '-'}": 1})
    except Exception:  # the store is what failed: the log line above is the record
        logger.debug("Could not count an unparkable task", exc_info=True)


def unparkable(
    task_name: str, task_id: str, reason: Reason, failed: int, trouble: BaseException
) -> Unparkable:
    """The FAILURE of a task that gave up parking."""
    return Unparkable(
        f"{task_name}[{task_id}] could not be parked after {failed} attempts "
        f"(reason {reason}): {type(trouble).__name__}: {trouble}"
    )


def _qualname(cls: type) -> str:
    name = cls.__qualname__
    return name if cls.__module__ == "builtins" else f"{cls.__module__}.{name}"
