"""``ResilientTask``: the base class an app adopts, with ``base=ResilientTask``.

Each delivery: admission (the breaker's permit, the delivery count, the dedup check) -> the body,
with nothing held -> success, or the outcome classified and settled with the breaker: ``retry_on``
(a breaker failure), ``park_on``, the body's own retry, any other exception (the task's own
FAILURE, not counted by the breaker). Whatever did not succeed gets a fate, decided as a value
(``fate.py``: retry with the backoff's jittered delay, park, keep, fail) and carried out
(``carry_out.py``); this class only ends the call the way Celery reads that fate.

No path of the package's own ends in an ack that loses the message: when admission, the store
or the retry's publish fails, the message is kept in the broker (published again, same id, in
``resilience_keep_delay`` seconds), and when even that publish fails it is requeued, never rejected.
"""

from __future__ import annotations

import sys
import time
import types
from typing import Any, NoReturn

from celery import Task
from celery.exceptions import Ignore, Reject, Retry

from . import body_retry, dedup, ending, fate, kept, parking, turned_away
from .backoff import BackoffStrategy, Exponential
from .backout.entry import ParkedTask
from .breaker.permit import Admission
from .breaker.store import Delivery
from .breaker_key import KeyOption, breaker_of
from .carry_out import carry_out
from .config import exception_types, task_options
from .events import send_task_parked
from .headers import REDELIVERED_HEADER, new_message_headers, redelivered, replays_of
from .redact import get_logger
from .runtime import Runtime
from .settle import settle as _settle
from .signals import task_parked

logger = get_logger("celery_resilience.task")

#: The admission of a task without a breaker and without delivery questions.
_NOTHING_ASKED = Admission(None, None)
PARKED = "PARKED"
#: Pause before a requeue (the broker took neither a retry nor a kept copy): a requeued message
#: comes straight back, and this keeps such a loop from spinning while both are down.
REQUEUE_PAUSE = 1.0


class ResilientTask(Task):  # type: ignore[misc]
    """A Celery task that calls its dependency through a shared breaker and never loses work.

    Options are class attributes, so ``@app.task(base=ResilientTask, breaker="payments")``
    keywords and subclasses both set them.
    """

    #: Name of the shared breaker this task calls through; ``None``: no breaker.
    breaker: str | None = None
    #: A breaker per destination: the key of ``<breaker>:<key>``, a template of the arguments
    #: (``"{host}"``) or a callable given them (``breaker_key.py``).
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
    #: A task id's body runs once: never after a success, never twice at once (see dedup.py).
    deduplicate: bool = False
    #: Seconds the body's client waits on the dependency at most (documents a hang's bound).
    call_timeout: float | None = None
    #: A hard time limit retries or parks the task instead of FAILURE (``time_limits.py``).
    Request = "celery_resilience.time_limits:ResilientRequest"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name") or cls.__qualname__
        cls.retry_on = exception_types(name, "retry_on", cls.retry_on)
        cls.park_on = exception_types(name, "park_on", cls.park_on)
        for option in ("backoff", "breaker_key"):  # a plain function takes no self
            if isinstance(cls.__dict__.get(option), types.FunctionType):
                setattr(cls, option, staticmethod(cls.__dict__[option]))
        task_options(name, cls.on_open, cls.backoff, cls.max_retries, cls.breaker, cls.breaker_key)

    @property
    def runtime(self) -> Runtime:
        """The app's runtime: settings, breakers, back-out store."""
        return Runtime.for_app(self.app)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        # A plain call, run as Celery runs it: outside a worker, or from inside a running body
        # (``fib(n - 1)``: the outer delivery's request, marked below, is still on the stack).
        if request.called_directly or request._protected:
            return super().__call__(*args, **kwargs)
        if parking_kept := kept.kept_park(request):  # a park failed: park again, body not run
            self._end(request, ending.KeptCopy(parking_kept[0], parking_kept[1:]))
        try:
            admission = self._admit(request)
        except Exception as exc:  # our own machinery failed before the body ran
            logger.exception("Admission of %s[%s] failed", self.name, request.id)
            self._end(request, ending.AdmissionFailed(exc))
        if (turned_down := ending.turned_down(admission)) is not None:
            self._end(request, turned_down)

        permit = admission.permit
        # Celery's mark that the delivery's own call was made: a worker's Task.__call__ skips
        # pushing a request once per delivery until it is set. Never unset: every delivery has
        # a new request, and the one pushed for a nested call copies it, mark included.
        request._protected = 1
        try:
            with dedup.given_back_unless_done(self, request, admission.claim):
                result = self.run(*args, **kwargs)
        except BaseException as exc:
            ended = ending.body_ended(exc, self.retry_on, self.park_on)
            if ended is None:  # SystemExit and the like: not ours to judge
                raise
            _settle(permit, ended.outcome)
            self._end(request, ended)
        _settle(permit, "success")
        if self.deduplicate:
            try:
                self.runtime.mark_done(self.breaker, request.id)
            except Exception:  # the work is done: bookkeeping must not turn it into a failure
                logger.exception("Could not mark %s[%s] done", self.name, request.id)
        return result

    def _end(self, request: Any, ended: ending.Ending) -> NoReturn:
        """The delivery did not succeed: its fate decided (``fate.py``), carried out
        (``carry_out.py``), and the call ended as Celery reads the fate that held."""
        held = self._carry_out(request, ended)
        match held:
            case fate.Retry(countdown, _, cause, _, eager=True):
                raise self.retry(exc=cause, countdown=countdown, max_retries=None)
            case fate.Retry(countdown, _, cause):
                raise Retry(exc=cause, when=countdown)
            case fate.Keep(delay, trouble):
                raise Retry(exc=trouble, when=delay)
            case fate.Park() | fate.Wait() | fate.Skip():
                raise Ignore()  # acked only now: the entry is stored, the copy published
            case fate.Requeue(trouble, cause):
                time.sleep(REQUEUE_PAUSE)
                # Requeued, or left unacked if the broker can't even take that: never dropped.
                raise Reject(trouble, requeue=True) from cause
            case fate.GiveUp(reason, failed, trouble):
                raise kept.unparkable(self.name, request.id, reason, failed, trouble) from trouble
            case fate.Fail(exc):
                if exc is sys.exc_info()[1]:  # called in the body's except: its traceback untouched
                    raise  # noqa: PLE0704
                raise exc
        raise AssertionError(f"no ending for {held!r}")

    def _carry_out(self, request: Any, ended: ending.Ending) -> fate.Fate:
        """The fate decided and carried out; requeued when even deciding fails (a broken
        runtime): the message stays in the broker."""
        try:
            delivery = fate.Delivery.of(request)
            config = self.runtime.config
            decided = fate.decide(ended, delivery, fate.Options.of(self), config)
        except Exception as trouble:
            if request.is_eager:
                raise
            logger.exception("Could not decide the fate of %s[%s]: requeued", self.name, request.id)
            return fate.Requeue(trouble, trouble)
        return carry_out(self, request, decided, delivery, config)

    # -- steps ------------------------------------------------------------------------------
    def retry(self, *args: Any, **kwargs: Any) -> Any:
        """Celery's ``Task.retry``, published by the package inside a delivery (``body_retry``)."""
        return body_retry.retry(self, super().retry, *args, **kwargs)

    def _admit(self, request: Any) -> Admission:
        runtime = Runtime.for_app(self.app)
        # Only a redelivery is counted (a first delivery can't be a crash loop): no key per task.
        count = bool(self.acks_late) and redelivered(request)
        if not count and not self.deduplicate:  # the common case: the breaker alone
            if self.breaker is None:
                return _NOTHING_ASKED
            return runtime.breaker(breaker_of(self, request) or self.breaker).admit()
        config = runtime.config
        delivery = Delivery(
            task_id=request.id,
            retries=request.retries or 0,
            replays=replays_of(request),
            count=count,
            check_done=self.deduplicate,
            ttl=config.delivery_ttl,
            max_deliveries=config.max_deliveries if self.acks_late else 0,
            **dedup.claim_of(self, request, config),  # an admitted delivery claims its task id
        )
        if self.breaker is not None:
            return runtime.breaker(breaker_of(self, request) or self.breaker).admit(delivery)
        return runtime.deliver(None, delivery)

    def _announce_parked(self, entry: ParkedTask, request: Any) -> None:
        """The Celery side of a park: PARKED state, ``task-parked`` event, ``task_parked``."""
        if not request.is_eager and not self.ignore_result and self.backend is not None:
            try:
                self.update_state(task_id=request.id, state=PARKED, meta=parking.parked_meta(entry))
            except Exception:  # the entry is safe; a result backend hiccup must not undo that
                logger.exception("Could not store state PARKED for %s", request.id)
        send_task_parked(self, entry)
        task_parked.send(sender=self, entry=entry, request=request)

    def _send_again(self, request: Any, countdown: float, retries: int, extra: Any = None) -> None:
        """Publish this delivery again, same task id, in ``countdown`` s (``extra``: headers)."""
        signature = self.signature_from_request(request, countdown=countdown, retries=retries)
        options = signature.options  # a new message is no redelivery
        options.pop(REDELIVERED_HEADER, None)  # from delivery_info
        # none of a kept copy's headers, nor the count of turn-aways in a row
        fresh = turned_away.forget(kept.without_kept(new_message_headers(options.get("headers"))))
        options["headers"] = {**fresh, **(extra or {})}
        signature.apply_async()


def resilient_tasks(app: Any) -> list[ResilientTask]:
    """The app's tasks that are ``ResilientTask`` (what the start-up checks look at)."""
    return [task for task in app.tasks.values() if isinstance(task, ResilientTask)]
