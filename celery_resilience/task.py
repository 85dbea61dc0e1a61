"""Celery's face of the package: ``ResilientTask``, the base class an app adopts with
``base=ResilientTask``, and ``ResilientRequest``, its ``Request`` class in the worker's main
process.

Each delivery goes one way through the pipeline (``delivery/pipeline.py``): admission, the body
with no lock around it, the body's end judged and the breaker's permit settled, and for whatever
did not succeed a fate decided as a value (``delivery/fate.py``: retry with the backoff's
jittered delay, park, keep, fail) and carried out (``delivery/carry_out.py``). The task hands
the delivery to it and raises what Celery reads of the fate carried out (``Retry``, ``Ignore``,
``Reject``, the task's own error); the request acks or requeues the message when a hard time
limit ended it, and when a pool child died mid-task it gives back the claim the delivery took
and releases its permit.

No path of the package's own ends in an ack that loses the message: when admission, the store
or the retry's publish fails, the message is kept in the broker (published again, same id, in
``resilience_keep_delay`` seconds), and when even that publish fails it is requeued, never rejected.
"""

from __future__ import annotations

import sys
import time
import types
import uuid
from functools import cached_property
from typing import Any, NoReturn

from billiard.einfo import ExceptionWithTraceback
from celery import Task
from celery.exceptions import Ignore, Reject, Retry, TimeLimitExceeded, WorkerLostError
from celery.worker import state
from celery.worker.request import Request

from .backoff import BackoffStrategy, Exponential
from .config import exception_types, task_options
from .delivery import body_retry, dedup_key, fate, kept, pipeline, time_limits
from .delivery.context import Delivery, KeyOption, Options
from .events import send_task_retried
from .headers import DELIVERY_HEADER, TASK_EVENTS_HEADER
from .redact import get_logger
from .runtime import Runtime

logger = get_logger("celery_resilience.task")

#: Pause before a requeue (the broker took neither a retry nor a kept copy): a requeued message
#: comes straight back, and this keeps such a loop from spinning while both are down.
REQUEUE_PAUSE = 1.0


class ResilientTask(Task):
    """A Celery task that calls its dependency through a shared breaker and never loses work.

    Options are class attributes, so ``@app.task(base=ResilientTask, breaker="payments")``
    keywords and subclasses both set them.
    """

    #: Name of the shared breaker this task calls through; ``None``: no breaker.
    breaker: str | None = None
    #: A breaker per destination: the key of ``<breaker>:<key>``, a template of the arguments
    #: (``"{host}"``) or a callable given them (``delivery/breaker_key.py``).
    breaker_key: KeyOption = None
    #: Transient exceptions: counted as breaker failures and retried with backoff.
    retry_on: tuple[type[BaseException], ...] = ()
    #: Exceptions that park the task at once (no retry).
    park_on: tuple[type[BaseException], ...] = ()
    #: Retries before the task is parked with reason ``retries_exhausted``.
    max_retries: int | None = 3
    #: Delay before each retry, a strategy from ``celery_resilience.backoff``.
    backoff: BackoffStrategy = Exponential(base=1.0, cap=300.0, jitter="full")
    #: What a delivery does when the breaker is open: ``"park"`` or ``"retry"`` after the
    #: breaker's remaining open time.
    on_open: str = "park"
    #: A task id's body runs once: never after a success, never twice at once
    #: (``delivery/dedup.py``); a template of the arguments (``"order:{order_id}"``) or a
    #: callable given them: the same for every task id with that key (``delivery/dedup_key.py``).
    deduplicate: bool | KeyOption = False
    #: Seconds the body's client waits on the dependency at most (documents a hang's bound).
    call_timeout: float | None = None
    #: A hard time limit retries or parks the task instead of FAILURE (:class:`ResilientRequest`).
    Request = "celery_resilience.task:ResilientRequest"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name") or cls.__qualname__
        cls.retry_on = exception_types(name, "retry_on", cls.retry_on)
        cls.park_on = exception_types(name, "park_on", cls.park_on)
        for option in ("backoff", "breaker_key", "deduplicate"):  # a plain function takes no self
            if isinstance(cls.__dict__.get(option), types.FunctionType):
                setattr(cls, option, staticmethod(cls.__dict__[option]))
        task_options(name, cls.on_open, cls.backoff, cls.max_retries, cls.breaker, cls.breaker_key)
        dedup_key.check(name, cls.deduplicate, cls.run)

    @property
    def runtime(self) -> Runtime:
        """The app's runtime: settings, breakers, back-out store."""
        return Runtime.for_app(self.app)

    @cached_property
    def _resilience_options(self) -> Options:
        """The options a delivery reads, once per task (they are class attributes)."""
        return Options(
            max_retries=self.max_retries,
            backoff=self.backoff,
            on_open=self.on_open,
            breaker=self.breaker,
            breaker_key=self.breaker_key,
            retry_on=self.retry_on,
            park_on=self.park_on,
            deduplicate=bool(self.deduplicate),
            dedup_key=None if isinstance(self.deduplicate, bool) else self.deduplicate,
            acks_late=bool(self.acks_late),
        )

    def _delivery(self, request: Any) -> Delivery:
        """``request``'s delivery, as the pipeline takes it."""
        return Delivery(self, self._resilience_options, request, Runtime.for_app(self.app))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        # A plain call, run as Celery runs it: outside a worker, or from inside a running body
        # (``fib(n - 1)``: the outer delivery's request, marked below, is still on the stack).
        if request.called_directly or request._protected:
            return super().__call__(*args, **kwargs)
        delivery = self._delivery(request)
        if (turned_down := pipeline.admit(delivery)) is not None:
            self._end(delivery, pipeline.end(delivery, turned_down))
        # Celery's mark that the delivery's own call was made: a worker's Task.__call__ skips
        # pushing a request once per delivery until it is set. Never unset: every delivery has
        # a new request, and the one pushed for a nested call copies it, mark included.
        request._protected = 1
        try:
            result = self.run(*args, **kwargs)
        except BaseException as exc:
            if (ended := pipeline.body_ended(delivery, exc)) is None:
                raise  # SystemExit and the like: not ours to judge
            self._end(delivery, pipeline.end(delivery, ended))
        pipeline.succeeded(delivery)
        return result

    def _end(self, delivery: Delivery, done: fate.Fate) -> NoReturn:
        """The delivery did not succeed: the call ended as Celery reads the fate carried out."""
        match done:
            case fate.Retry(countdown, _, cause, _, eager=True):
                raise self.retry(exc=cause, countdown=countdown, max_retries=None)
            case fate.Retry(countdown, _, cause):
                shown = delivery.shown(cause)
                if shown is cause:
                    raise Retry(exc=cause, when=countdown)
                # Celery stores and logs the cause, and the traceback of what it was raised in.
                raise Retry(exc=shown, when=countdown) from None
            case fate.Keep(delay, trouble):
                raise Retry(exc=trouble, when=delay)
            case fate.Park() | fate.Wait() | fate.Skip():
                raise Ignore()  # acked only now: the entry is stored, the copy published
            case fate.Requeue(trouble, cause):
                time.sleep(REQUEUE_PAUSE)
                # Requeued, or left unacked if the broker can't even take that: never dropped.
                raise Reject(trouble, requeue=True) from cause
            case fate.GiveUp(reason, failed, trouble):
                request = delivery.request
                raise kept.unparkable(self.name, request.id, reason, failed, trouble) from trouble
            case fate.Fail(exc):
                if isinstance(exc, Retry):  # the body's own Retry: Celery's handler sends nothing
                    send_task_retried(self, delivery.shown(exc.exc))
                if exc is sys.exc_info()[1]:  # called in the body's except: its traceback untouched
                    raise  # noqa: PLE0704
                raise exc
        raise AssertionError(f"no ending for {done!r}")

    def retry(self, *args: Any, **kwargs: Any) -> Any:
        """Celery's ``Task.retry``, published by the package inside a delivery (``body_retry``)."""
        return body_retry.retry(self.request, super().retry, *args, **kwargs)


class ResilientRequest(Request):
    """Celery's ``Request`` of a ``ResilientTask``, in the worker's main process: a hard time
    limit retries or parks the task instead of a FAILURE that acks it away, and for a pool
    child that died the delivery's claim is given back and its permit released
    (``delivery/time_limits.py``)."""

    __slots__ = ("_time_limit_done",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The token of this delivery's claim and bulkhead slot or probe: sent to the pool with
        # the request (a header there), never published.
        self._request_dict[DELIVERY_HEADER] = uuid.uuid4().hex
        # Whether this process sends the delivery's task events: if so, its ``task-retried`` is
        # sent where the retry is published, before it is (``headers.TASK_EVENTS_HEADER``). A
        # message may carry the mark (Celery's own retry publishes the request's headers): it
        # is this process's to say.
        if self._sends_task_events():
            self._request_dict[TASK_EVENTS_HEADER] = 1
        else:
            self._request_dict.pop(TASK_EVENTS_HEADER, None)

    def _sends_task_events(self) -> bool:
        """Whether Celery's ``Request.send_event`` would send this delivery's task events: a
        worker without ``-E`` has its dispatcher on for worker events only (heartbeats)."""
        eventer = self._eventer
        if not (eventer and eventer.enabled and self.task.send_events):
            return False
        groups = getattr(eventer, "groups", None)
        return not groups or "task" in groups

    def on_retry(self, exc_info: Any) -> None:
        if not self._request_dict.get(TASK_EVENTS_HEADER):
            super().on_retry(exc_info)
            return
        # The retry's task-retried was sent before the retry was published
        # (``events.send_task_retried``): Celery's own would come after the retry's events.
        if self.task.acks_late:
            self.acknowledge()

    def on_timeout(self, soft: bool, timeout: float) -> None:
        if soft or state.should_terminate:  # a cold shutdown: Celery's own handling
            super().on_timeout(soft, timeout)
            return
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
        if isinstance(exc, WorkerLostError):  # the child died mid-task: before the requeue
            time_limits.lost(self.task._delivery(self._context))
        super().on_failure(exc_info, send_failed_event, return_ok)

    def _time_limit(self, timeout: float | None) -> None:
        # The pool reports the kill twice (as the job's failure, then as its timeout): once here.
        if getattr(self, "_time_limit_done", False):
            return
        self._time_limit_done = True
        time_limits.kill_child(self.worker_pid)  # billiard kills it only after this handler
        state.task_ready(self)
        task, request = self.task, self._context
        exc = TimeLimitExceeded(timeout)
        logger.error("Hard time limit (%ss) exceeded for %s[%s]", timeout, task.name, self.id)
        task.request_stack.push(request)  # events and state updates name this task
        try:
            done: fate.Fate | None = time_limits.timed_out(task._delivery(request), exc)
        except Exception as trouble:  # nothing stored, nothing published: the broker keeps it
            logger.error(
                "Could not retry, park or keep %s[%s] after its time limit (%s: %s): requeued",
                task.name,
                self.id,
                type(trouble).__name__,
                trouble,
            )
            done = None
        finally:
            task.request_stack.pop()
        match done:
            case fate.GiveUp():  # every park failed: logged at ERROR; Celery's FAILURE and ack
                super().on_timeout(False, timeout)
                return
            case fate.Requeue() | None:  # nothing could be published: requeued, never dropped
                self.reject(requeue=True)
                return
            case fate.Retry(countdown):  # its task-retried was sent before the publish
                outcome = f"retried in {countdown:.2f}s"
            case fate.Keep(delay):
                outcome = f"kept (park failed, again in {delay:.2f}s)"
            case fate.Park(reason):
                outcome = f"parked ({reason})"
            case _:
                raise AssertionError(f"a time limit cannot end as {done!r}")
        logger.warning("Task %s[%s] %s after its hard time limit", task.name, self.id, outcome)
        self.acknowledge()


def resilient_tasks(app: Any) -> list[ResilientTask]:
    """The app's tasks that are ``ResilientTask`` (what the start-up checks look at)."""
    return [task for task in app.tasks.values() if isinstance(task, ResilientTask)]
