"""A hard time limit, the package's way: the task is retried or parked, never acked away.

Celery kills a pool child whose task ran past ``time_limit`` and handles the end in the worker's
main process (``Request.on_failure`` with ``TimeLimitExceeded``, then ``Request.on_timeout``):
it marks FAILURE and, with ``acks_late``, acks the message. ``ResilientTask`` names
:class:`ResilientRequest` as its ``Request`` class, so there instead the package counts a breaker
failure (the dependency hung) and takes its retry path from the main process: published again
(same id, ``retries + 1``, the task's backoff), or parked when retries run out or the publish
fails (reasons ``retries_exhausted`` / ``delay_too_long``, ``exc_type``
``billiard.exceptions.TimeLimitExceeded``); when the park fails, a kept copy (``kept.py``) or, if
the broker refuses even that, a requeue. The message is acked only after one of these held.

A soft time limit raises ``SoftTimeLimitExceeded`` inside the body: the task handles it there.
"""

from __future__ import annotations

from typing import Any

from billiard.einfo import ExceptionWithTraceback
from celery.exceptions import TimeLimitExceeded
from celery.worker import state
from celery.worker.request import Request

from . import kept, parking
from .breaker.permit import Permit
from .errors import Unparkable
from .parked.entry import Reason
from .redact import get_logger

logger = get_logger("celery_resilience.task")


class ResilientRequest(Request):  # type: ignore[misc]
    """Celery's ``Request`` whose hard time limit retries or parks the task (module docstring)."""

    __slots__ = ("_time_limit_done",)

    def on_timeout(self, soft: bool, timeout: float) -> None:
        if soft or state.should_terminate:  # a cold shutdown: Celery's own handling
            return super().on_timeout(soft, timeout)  # type: ignore[no-any-return]
        self._time_limit(timeout)

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> None:
        exc = exc_info.exception
        if isinstance(exc, ExceptionWithTraceback):
            exc = exc.exc
        if isinstance(exc, TimeLimitExceeded) and not state.should_terminate:
            self._time_limit(exc.args[0] if exc.args else None)
            return
        super().on_failure(exc_info, send_failed_event, return_ok)

    def _time_limit(self, timeout: float | None) -> None:
        # The pool reports the kill twice (as the job's failure, then as its timeout): once here.
        if getattr(self, "_time_limit_done", False):
            return
        self._time_limit_done = True
        state.task_ready(self)
        task, request = self.task, self._context
        exc = TimeLimitExceeded(timeout)
        logger.error("Hard time limit (%ss) exceeded for %s[%s]", timeout, task.name, self.id)
        record_failure(task)
        task.request_stack.push(request)  # events and state updates name this task
        try:
            outcome = retry_or_park(task, request, exc)
        except Unparkable:  # every park failed: logged at ERROR; Celery's FAILURE and ack
            task.request_stack.pop()
            super().on_timeout(False, timeout)
            return
        except Exception as trouble:  # nothing stored, nothing published: the broker keeps it
            task.request_stack.pop()
            logger.error(
                "Could not retry, park or keep %s[%s] after its time limit (%s: %s): requeued",
                task.name,
                self.id,
                type(trouble).__name__,
                trouble,
            )
            self.reject(requeue=True)
            return
        task.request_stack.pop()
        logger.warning("Task %s[%s] %s after its hard time limit", task.name, self.id, outcome)
        if outcome.startswith("retried"):  # what Celery's own retry tells Flower
            self.send_event("task-retried", exception=repr(exc), traceback="")
        self.acknowledge()


def record_failure(task: Any) -> None:
    """A breaker failure for the call the kill ended (its permit died with the pool child).

    Counted as a normal call: a killed half-open probe's slot comes back when its lease ends
    (``probe_lease``); a soft time limit below the hard one frees it at once."""
    if task.breaker is None:
        return
    try:
        Permit(task.runtime.breaker(task.breaker), "normal").failure()
    except Exception:  # bookkeeping never changes the task's fate
        logger.exception("Could not record the time limit of %s as a failure", task.breaker)


def retry_or_park(task: Any, request: Any, exc: BaseException) -> str:
    """``ResilientTask._retry_or_park`` without raising (we are not inside the task's call)."""
    runtime = task.runtime
    retries = request.retries or 0
    if task.max_retries is not None and retries >= task.max_retries:
        return park(task, request, "retries_exhausted", exc, task.backoff(retries))
    countdown = task.backoff(retries)
    if countdown > runtime.config.max_countdown:
        return park(task, request, "delay_too_long", exc, countdown)
    try:
        task._send_again(request, countdown, retries + 1)
    except Exception as publish_error:
        runtime.retry_trouble.failed(
            publish_error, "Could not publish the retry of %s[%s]", task.name, request.id
        )
        return park(task, request, "delay_too_long", exc, countdown)
    runtime.retry_trouble.ok()
    runtime.count_retry(task.breaker)
    return f"retried in {countdown:.2f}s"


def park(task: Any, request: Any, reason: Reason, exc: BaseException, due_in: float) -> str:
    """Park, or keep a copy that parks later; raises only when neither could be done."""
    runtime = task.runtime
    try:
        options = task.signature_from_request(request).options
        entry = parking.new_entry(
            task.name, request, options, task.breaker, reason, exc, runtime.now(), due_in
        )
        parking.store(runtime.backout_store, entry)
    except Exception as trouble:
        runtime.park_trouble.failed(
            trouble, "Could not park %s[%s] (%s); kept", task.name, request.id, reason
        )
        delay, headers = kept.next_copy(task, request, reason, exc, trouble)
        task._send_again(request, delay, request.retries or 0, headers)
        return f"kept (park failed, again in {delay:.2f}s)"
    runtime.park_trouble.ok()
    task._announce_parked(entry, request)
    return f"parked ({reason})"
