"""``ResilientTask``: the base class an app adopts, with ``base=ResilientTask``.

Each delivery: admission (one round trip: breaker permit, delivery count, dedup check) ->
the body, with nothing held -> the outcome classified: success; ``retry_on`` (a breaker failure,
retried through ``apply_async(countdown=...)`` with the backoff's jittered delay, or parked when
retries run out or the delay is longer than the broker holds safely); ``park_on`` (parked); any
other exception (the task's own FAILURE, not counted by the breaker).
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn

from celery import Task
from celery.exceptions import Ignore, Retry

from . import signals
from .backoff import BackoffStrategy, Exponential
from .backout.entry import Reason
from .breaker.breaker import Admission, Permit
from .breaker.store import Delivery
from .errors import BreakerOpen, ConfigurationError
from .parking import park, replays_of
from .resilience import Resilience

logger = logging.getLogger("celery_resilience.task")
signals.connect()

ON_OPEN = ("park", "retry")


def _exception_types(task: str, option: str, value: Any) -> tuple[type[BaseException], ...]:
    items = value if isinstance(value, (tuple, list)) else (value,)
    if not all(isinstance(t, type) and issubclass(t, BaseException) for t in items):
        raise ConfigurationError(f"{task}.{option} must be exception classes, got {value!r}")
    return tuple(items)


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
    #: Skip a delivery whose task id already succeeded (marker kept ``resilience_dedup_ttl``).
    deduplicate: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name") or cls.__qualname__
        cls.retry_on = _exception_types(name, "retry_on", cls.retry_on)
        cls.park_on = _exception_types(name, "park_on", cls.park_on)
        if cls.on_open not in ON_OPEN:
            raise ConfigurationError(
                f"{name}.on_open must be 'park' or 'retry', got {cls.on_open!r}"
            )
        if not isinstance(cls.backoff, BackoffStrategy):
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
    def resilience(self) -> Resilience:
        """The app's :class:`Resilience` (settings, breakers, back-out store)."""
        return Resilience.for_app(self.app)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly:  # a plain function call, outside any worker: just run it
            return super().__call__(*args, **kwargs)  # Celery's: pushes request and task stack
        admission = self._admit(request)
        if admission.skip == "done":
            logger.info("Task %s[%s] already succeeded: skipped", self.name, request.id)
            raise Ignore()
        if admission.skip == "redelivered":
            self._park("redelivered", None, request)
        if admission.rejected is not None:
            self._rejected(admission.rejected, request)

        permit = admission.permit
        try:
            result = self.run(*args, **kwargs)
        except (Retry, Ignore):  # the body's own retry() or Ignore: Celery's business
            _settle(permit, success=True)
            raise
        except self.park_on as exc:
            # The dependency answered "not now": it is up, so a probe counts as a success.
            _settle(permit, success=True)
            self._park("park_on", exc, request)
        except self.retry_on as exc:
            _settle(permit, success=False)
            self._retry_or_park(exc, request)
        except Exception:
            # The task's own failure (a bug, bad input). Only a probe is settled, as a success:
            # the dependency was not judged, and its permit must not wait for the lease.
            if permit is not None and permit.kind == "probe":
                permit.success()
            raise
        _settle(permit, success=True)
        if self.deduplicate:
            self.resilience.mark_done(self.breaker, request.id)
        return result

    # -- steps ------------------------------------------------------------------------------
    def _admit(self, request: Any) -> Admission:
        config = self.resilience.config
        delivery = None
        if self.acks_late or self.deduplicate:
            delivery = Delivery(
                task_id=request.id,
                retries=request.retries or 0,
                replays=replays_of(request),
                count=bool(self.acks_late),
                check_done=self.deduplicate,
                ttl=config.delivery_ttl,
                max_deliveries=config.max_deliveries if self.acks_late else 0,
            )
        if self.breaker is not None:
            return self.resilience.breaker(self.breaker).admit(delivery)
        if delivery is None:
            return Admission(None, None)
        return self.resilience.deliver(None, delivery)

    def _rejected(self, rejected: BreakerOpen, request: Any) -> NoReturn:
        if self.on_open == "retry":
            self._retry_or_park(rejected, request, delay=rejected.retry_after)
        self._park("breaker_open", rejected, request)

    def _retry_or_park(
        self, exc: BaseException, request: Any, delay: float | None = None
    ) -> NoReturn:
        retries = request.retries or 0
        if self.max_retries is not None and retries >= self.max_retries:
            reason: Reason = "breaker_open" if isinstance(exc, BreakerOpen) else "retries_exhausted"
            self._park(reason, exc, request, due_in=self.backoff(retries))
        countdown = self.backoff(retries) if delay is None else delay
        if countdown > self.resilience.config.max_countdown:
            # kombu redelivers ETA messages held past the visibility timeout: park instead.
            self._park("delay_too_long", exc, request, due_in=countdown)
        logger.info(
            "Task %s[%s] retry %d/%s in %.2fs: %r",
            self.name,
            request.id,
            retries + 1,
            self.max_retries,
            countdown,
            exc,
        )
        self.resilience.count_retry(self.breaker)
        # Celery's retry path: same task id, retries + 1, published with apply_async(countdown).
        raise self.retry(exc=exc, countdown=countdown, max_retries=None)

    def _park(
        self, reason: Reason, exc: BaseException | None, request: Any, due_in: float = 0.0
    ) -> NoReturn:
        park(self, reason, exc, request, due_in)
        raise Ignore()  # the message is acked only now, after the entry is stored


def _settle(permit: Permit | None, success: bool) -> None:
    if permit is not None:
        if success:
            permit.success()
        else:
            permit.failure()
