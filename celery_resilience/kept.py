"""A kept copy: the message a task publishes again when the back-out store refused its park.

Its headers say that the body already ran (or must not run) and why the task was being parked,
so its next delivery goes straight to parking. Each failed attempt waits longer in the broker
(``resilience_keep_delay``, doubling, at most ``resilience_max_countdown``); after
``resilience_park_attempts`` failed parks the task gives up where a person sees it: an ERROR
log line with the task, the ``celery_resilience_unparkable_total`` counter and a Celery FAILURE
(:class:`~celery_resilience.errors.Unparkable`) in the result backend. Never a silent drop,
never an endless loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn, cast

from .errors import Unparkable
from .parked.entry import REASONS, Reason
from .redact import get_logger

logger = get_logger("celery_resilience.park")
#: What a task gave for parking: the exception, or its (type, message) from a kept copy.
Cause = BaseException | tuple[str, str] | None
#: A kept copy to publish: its countdown and its headers.
Copy = tuple[float, dict[str, Any]]

#: Message header: the number of parks that failed for this task so far (absent: none).
KEPT_HEADER = "resilience_kept"
#: Message header: the reason the task was being parked.
KEPT_REASON_HEADER = "resilience_kept_reason"
#: Message header: ``"<exception type>: <message>"`` of the cause, for the entry.
KEPT_ERROR_HEADER = "resilience_kept_error"


def _header(request: Any, name: str) -> Any:
    value = getattr(request, name, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(name)
    return value


def failed_parks(request: Any) -> int:
    """How many parks failed before this delivery (0: not a kept copy of a park)."""
    try:
        return max(0, int(_header(request, KEPT_HEADER) or 0))
    except (TypeError, ValueError):
        return 0


def kept_park(request: Any) -> tuple[Reason, str, str] | None:
    """``(reason, exc_type, exc_message)`` when this delivery is a kept copy of a park that
    must not run the body. A copy of a ``breaker_open`` park never ran it: the breaker decides
    again (it parks the copy while open, runs it once closed), its failed parks still counted."""
    if not failed_parks(request):
        return None
    reason = str(_header(request, KEPT_REASON_HEADER) or "")
    if reason == "breaker_open":
        return None
    if reason not in REASONS:
        reason = "retries_exhausted"  # a header mangled on the way: still parked, never run
    exc_type, _, exc_message = str(_header(request, KEPT_ERROR_HEADER) or "").partition(": ")
    return cast(Reason, reason), exc_type, exc_message


def next_copy(
    task: Any,
    request: Any,
    reason: Reason,
    exc: Cause,
    trouble: BaseException,
) -> Copy:
    """The countdown and headers of the next kept copy of a failed park; gives up (raises
    :class:`Unparkable`) when this was the last attempt."""
    config = task.runtime.config
    failed = failed_parks(request) + 1
    if failed >= config.park_attempts:
        give_up(task, request, reason, failed, trouble)
    delay = min(config.keep_delay * 2 ** (failed - 1), config.max_countdown)
    if isinstance(exc, BaseException):
        error = f"{_qualname(type(exc))}: {exc}"
    else:
        error = ": ".join(exc or ())
    headers = {KEPT_HEADER: failed, KEPT_REASON_HEADER: reason, KEPT_ERROR_HEADER: error}
    return delay, headers


def without_kept(headers: Mapping[str, Any]) -> dict[str, Any]:
    """Headers of an entry parked from a kept copy: its replay is a normal delivery again."""
    drop = (KEPT_HEADER, KEPT_REASON_HEADER, KEPT_ERROR_HEADER)
    return {k: v for k, v in headers.items() if k not in drop}


def give_up(
    task: Any, request: Any, reason: Reason, failed: int, trouble: BaseException
) -> NoReturn:
    """Every park attempt failed: an ERROR log line with what a person needs to redo the task,
    the counter, and a Celery FAILURE (the message is acked: it has nowhere else to go)."""
    logger.error(
        "Gave up parking %s[%s] after %d failed parks (reason %s, last error %s: %s); "
        "args=%r kwargs=%r: the task must be redone by hand",
        task.name,
        request.id,
        failed,
        reason,
        type(trouble).__name__,
        trouble,
        request.args,
        request.kwargs,
    )
    try:
        task.runtime.backout_store.bump({f"unparkable|{task.breaker or '-'}": 1})
    except Exception:  # the store is what failed: the log line above is the record
        logger.debug("Could not count an unparkable task", exc_info=True)
    raise Unparkable(
        f"{task.name}[{request.id}] could not be parked after {failed} attempts "
        f"(reason {reason}): {type(trouble).__name__}: {trouble}"
    ) from trouble


def _qualname(cls: type) -> str:
    name = cls.__qualname__
    return name if cls.__module__ == "builtins" else f"{cls.__module__}.{name}"
