"""A hard time limit, the package's way: the task is retried or parked, never acked away.

Celery kills a pool child whose task ran past ``time_limit`` and handles the end in the worker's
main process (``Request.on_failure`` with ``TimeLimitExceeded``, then ``Request.on_timeout``):
it marks FAILURE and, with ``acks_late``, acks the message. ``ResilientTask`` names
:class:`ResilientRequest` as its ``Request`` class, so there instead the package counts a breaker
failure (the dependency hung) and gives the delivery the fate of a call that hung (``fate.py``,
carried out by ``carry_out.py`` from the main process): published again (same id,
``retries + 1``, the task's backoff), or parked when retries run out or the publish fails
(reasons ``retries_exhausted`` / ``delay_too_long``, ``exc_type``
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

from . import ending, fate
from .breaker.permit import Permit
from .breaker_key import breaker_of
from .carry_out import carry_out
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
        record_failure(task, request)
        task.request_stack.push(request)  # events and state updates name this task
        try:
            held = _retry_or_park(task, request, exc)
        except Exception as trouble:  # nothing stored, nothing published: the broker keeps it
            logger.error(
                "Could not retry, park or keep %s[%s] after its time limit (%s: %s): requeued",
                task.name,
                self.id,
                type(trouble).__name__,
                trouble,
            )
            held = None
        finally:
            task.request_stack.pop()
        match held:
            case fate.GiveUp():  # every park failed: logged at ERROR; Celery's FAILURE and ack
                super().on_timeout(False, timeout)
                return
            case fate.Requeue() | None:  # nothing could be published: requeued, never dropped
                self.reject(requeue=True)
                return
            case fate.Retry(countdown):  # what Celery's own retry tells Flower
                done = f"retried in {countdown:.2f}s"
                self.send_event("task-retried", exception=repr(exc), traceback="")
            case fate.Keep(delay):
                done = f"kept (park failed, again in {delay:.2f}s)"
            case fate.Park(reason):
                done = f"parked ({reason})"
            case _:
                raise AssertionError(f"a time limit cannot end as {held!r}")
        logger.warning("Task %s[%s] %s after its hard time limit", task.name, self.id, done)
        self.acknowledge()


def record_failure(task: Any, request: Any) -> None:
    """A breaker failure for the call the kill ended (its permit died with the pool child).

    Counted as a normal call: a killed half-open probe's slot comes back when its lease ends
    (``probe_lease``); a soft time limit below the hard one frees it at once."""
    if task.breaker is None:
        return
    try:
        Permit(task.runtime.breaker(breaker_of(task, request)), "normal").failure()
    except Exception:  # bookkeeping never changes the task's fate
        logger.exception("Could not record the time limit of %s as a failure", task.name)


def _retry_or_park(task: Any, request: Any, exc: BaseException) -> fate.Fate:
    """The task's own fate for a call that hung (``fate.Transient``), carried out from here."""
    delivery = fate.Delivery.of(request)
    config = task.runtime.config
    decided = fate.decide(ending.Transient(exc), delivery, fate.Options.of(task), config)
    return carry_out(task, request, decided, delivery, config)
