"""``ResilientTask``: the base class an app adopts, with ``base=ResilientTask``.

Each delivery: admission (the breaker's permit, the delivery count, the dedup check) -> the body,
with nothing held -> the outcome classified: success; ``retry_on`` (a breaker failure, retried
through ``apply_async(countdown=...)`` with the backoff's jittered delay, or parked when retries
run out or the delay is longer than the broker holds safely); ``park_on`` (parked); any other
exception (the task's own FAILURE, not counted by the breaker).

No path of the package's own ends in an ack that loses the message: when admission, the store
or the retry's publish fails, the message is kept in the broker (published again, same id, in
``resilience_keep_delay`` seconds), and when even that publish fails it is requeued, never rejected.
"""

from __future__ import annotations

import time
from typing import Any, NoReturn

from celery import Task
from celery.exceptions import Ignore, Reject, Retry, SoftTimeLimitExceeded

from . import body_retry, dedup, kept, parking
from .backoff import BackoffStrategy, Exponential
from .breaker.permit import Admission
from .breaker.store import Delivery
from .config import exception_types
from .errors import BreakerOpen, BulkheadFull, ConfigurationError
from .events import send_task_parked
from .headers import REDELIVERED_HEADER, new_message_headers, redelivered, replays_of
from .parked.entry import ParkedTask, Reason
from .redact import get_logger
from .runtime import Runtime
from .settle import settle as _settle
from .signals import task_parked

logger = get_logger("celery_resilience.task")

ON_OPEN = ("park", "retry")
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
        if cls.on_open not in ON_OPEN:
            raise ConfigurationError(
                f"{name}.on_open must be 'park' or 'retry', got {cls.on_open!r}"
            )
        if not callable(cls.backoff):
            raise ConfigurationError(
                f"{name}.backoff must be a backoff strategy, got {cls.backoff!r}"
            )
        retries = cls.max_retries
        if retries is not None and (
            isinstance(retries, bool) or not isinstance(retries, int) or retries < 0
        ):
            raise ConfigurationError(f"{name}.max_retries must be an integer >= 0, got {retries!r}")
        if cls.breaker is not None and not isinstance(cls.breaker, str):
            raise ConfigurationError(f"{name}.breaker must be a breaker name, got {cls.breaker!r}")

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
            self._park(parking_kept[0], parking_kept[1:], request)
        try:
            admission = self._admit(request)
        except Exception as exc:  # our own machinery failed before the body ran
            logger.exception("Admission of %s[%s] failed", self.name, request.id)
            self._keep(request, exc)
        if admission.skip:
            dedup.skipped(self, request, admission)  # done: skipped; claimed: waits its turn
            self._park("redelivered", None, request)
        if admission.rejected is not None:
            self._rejected(admission.rejected, request)

        permit = admission.permit
        # Celery's mark that the delivery's own call was made: a worker's Task.__call__ skips
        # pushing a request once per delivery until it is set. Never unset: every delivery has
        # a new request, and the one pushed for a nested call copies it, mark included.
        request._protected = 1
        try:
            with dedup.given_back_unless_done(self, request, admission.claim):
                result = self.run(*args, **kwargs)
        except body_retry.BodyRetry as wish:  # the body's self.retry() / autoretry_for
            _settle(permit, wish.outcome(self.retry_on))
            self._retry_or_park(wish.exc, request, wish.countdown, wish.max_retries)
        except (Retry, Ignore, Reject):  # the body's own retry(), Ignore or Reject: Celery's
            _settle(permit, "success")
            raise
        except self.park_on as exc:
            # The dependency answered "not now": it is up, so a probe counts as a success.
            _settle(permit, "success")
            due_in = self.runtime.config.park_on_due_in(replays_of(request))
            self._park("park_on", exc, request, due_in=due_in)
        except self.retry_on as exc:
            _settle(permit, "failure")
            self._retry_or_park(exc, request)
        except SoftTimeLimitExceeded as exc:  # the dependency hangs: a slow call, retried
            _settle(permit, "failure")
            self._retry_or_park(exc, request)
        except Exception:
            # The task's own failure (a bug, bad input): the dependency was not judged. A probe
            # is released, so the next call probes at once instead of after the lease.
            _settle(permit, "release")
            raise
        _settle(permit, "success")
        if self.deduplicate:
            try:
                self.runtime.mark_done(self.breaker, request.id)
            except Exception:  # the work is done: bookkeeping must not turn it into a failure
                logger.exception("Could not mark %s[%s] done", self.name, request.id)
        return result

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
            return runtime.breaker(self.breaker).admit()
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
            return runtime.breaker(self.breaker).admit(delivery)
        return runtime.deliver(None, delivery)

    def _rejected(self, rejected: BreakerOpen, request: Any) -> NoReturn:
        waits = isinstance(rejected, BulkheadFull) and not request.is_eager  # busy, not down
        if self.on_open == "retry" or waits:
            self._retry_or_park(rejected, request, rejected.retry_after, spent=int(not waits))
        self._park("breaker_open", rejected, request)

    def _retry_or_park(
        self,
        exc: BaseException | None,
        request: Any,
        delay: float | None = None,
        max_retries: int | None = None,  # the body's own retry(max_retries=...)
        spent: int = 1,  # 0: turned away unrun by a full bulkhead, no attempt used
    ) -> NoReturn:
        retries = request.retries or 0
        limit = self.max_retries if max_retries is None else max_retries
        if spent and limit is not None and retries >= limit:
            reason: Reason = "breaker_open" if isinstance(exc, BreakerOpen) else "retries_exhausted"
            self._park(reason, exc, request, due_in=self.backoff(retries))
        countdown = self.backoff(retries) if delay is None else delay
        if countdown > self.runtime.config.max_countdown:
            # kombu redelivers ETA messages held past the visibility timeout: park instead.
            self._park("delay_too_long", exc, request, due_in=countdown)
        logger.info(
            "Task %s[%s] retry %d/%s in %.2fs: %r",
            self.name,
            request.id,
            retries + spent,
            self.max_retries,
            countdown,
            exc,
        )
        if request.is_eager:  # Celery runs an eager retry at once, in apply(): nothing to publish
            raise self.retry(exc=exc, countdown=countdown, max_retries=None)
        try:
            # Published here, not through Task.retry: Celery turns a failed publish there into
            # Reject(requeue=False), and with acks_late the message would be gone.
            self._send_again(request, countdown, retries + spent)
        except Exception as publish_error:
            self.runtime.retry_trouble.failed(
                publish_error,
                "Could not publish the retry of %s[%s]; parked until it was due",
                self.name,
                request.id,
            )
            self._park("delay_too_long", exc, request, due_in=countdown)
        self.runtime.retry_trouble.ok()
        self.runtime.count_retry(self.breaker)
        raise Retry(exc=exc, when=countdown)

    def _park(self, reason: Reason, exc: kept.Cause, request: Any, due_in: float = 0.0) -> NoReturn:
        try:
            runtime = self.runtime
            options = self.signature_from_request(request).options
            entry = parking.new_entry(
                self.name, request, options, self.breaker, reason, exc, runtime.now(), due_in
            )
            parking.store(runtime.backout_store, entry)
        except Exception as trouble:  # whatever the store answered: the message must stay
            self.runtime.park_trouble.failed(
                trouble,
                "Could not park %s[%s] (%s); kept in the broker",
                self.name,
                request.id,
                reason,
            )
            self._keep(request, trouble, kept.next_copy(self, request, reason, exc, trouble))
        self.runtime.park_trouble.ok()
        self._announce_parked(entry, request)
        raise Ignore()  # the message is acked only now, after the entry is stored

    def _announce_parked(self, entry: ParkedTask, request: Any) -> None:
        """The Celery side of a park: PARKED state, ``task-parked`` event, ``task_parked``."""
        if not request.is_eager and not self.ignore_result and self.backend is not None:
            try:
                self.update_state(task_id=request.id, state=PARKED, meta=parking.parked_meta(entry))
            except Exception:  # the entry is safe; a result backend hiccup must not undo that
                logger.exception("Could not store state PARKED for %s", request.id)
        send_task_parked(self, entry)
        task_parked.send(sender=self, entry=entry, request=request)

    def _keep(self, request: Any, trouble: Exception, copy: kept.Copy | None = None) -> NoReturn:
        """Our side failed (admission, the store): the message stays in the broker. A ``copy``
        kept for a park (``kept.py``: its countdown, headers) parks without running the body."""
        if request.is_eager:
            raise trouble  # no broker to wait in: the caller sees the error
        try:
            delay, headers = copy or (self.runtime.config.keep_delay, {})
            self._send_again(request, delay, request.retries or 0, headers)
        except Exception as publish_error:
            logger.error(
                "Could not keep %s[%s] in the broker either (%s: %s): requeued",
                self.name,
                request.id,
                type(publish_error).__name__,
                publish_error,
            )
            time.sleep(REQUEUE_PAUSE)
            # Requeued, or left unacked if the broker can't even take that: never dropped.
            raise Reject(publish_error, requeue=True) from trouble
        raise Retry(exc=trouble, when=delay)

    def _send_again(self, request: Any, countdown: float, retries: int, extra: Any = None) -> None:
        """Publish this delivery again, same task id, in ``countdown`` seconds (``extra``
        headers: a kept copy's)."""
        signature = self.signature_from_request(request, countdown=countdown, retries=retries)
        options = signature.options  # a new message is no redelivery
        options.pop(REDELIVERED_HEADER, None)  # from delivery_info
        fresh = kept.without_kept(new_message_headers(options.get("headers")))  # none of a copy's
        options["headers"] = {**fresh, **(extra or {})}
        signature.apply_async()


def resilient_tasks(app: Any) -> list[ResilientTask]:
    """The app's tasks that are ``ResilientTask`` (what the start-up checks look at)."""
    return [task for task in app.tasks.values() if isinstance(task, ResilientTask)]
