"""The body's own ``self.retry()`` (and ``autoretry_for``, which calls it), the package's way.

Celery's ``Task.retry`` publishes the retry itself and turns a refused publish into
``Reject(requeue=False)``: with ``acks_late`` the message is gone. Inside a delivery that
``ResilientTask`` runs, ``retry()`` raises :class:`BodyRetry` instead; the task catches it after
the body, settles the breaker's permit (a failure when the cause is a ``retry_on`` error or a
soft time limit: a half-open probe that retries must not close the breaker) and takes its own
retry path (``fate.py``): published by the package, parked when retries run out or the broker
refuses it.
Outside a worker's delivery (a direct call, eager mode, ``throw=False``) Celery's own retry runs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from celery.exceptions import Retry
from celery.utils.time import maybe_make_aware


class BodyRetry(Retry):
    """The body asked for a retry; ``ResilientTask`` publishes it (see the module docstring)."""

    def __init__(
        self,
        exc: BaseException | None,
        countdown: float | None,
        max_retries: int | None,
    ) -> None:
        super().__init__(exc=exc, when=countdown)
        #: The seconds the body asked for (``countdown``, or ``eta`` from now); ``None``: the
        #: task's backoff decides.
        self.countdown = countdown
        #: The body's ``max_retries`` for this delivery; ``None``: the task's own.
        self.max_retries = max_retries


def retry(
    request: Any,
    celery_retry: Callable[..., Any],
    args: Any = None,
    kwargs: Any = None,
    exc: BaseException | None = None,
    throw: bool = True,
    eta: datetime | None = None,
    countdown: float | None = None,
    max_retries: int | None = None,
    **options: Any,
) -> Any:
    """``Task.retry`` of a ``ResilientTask`` whose current request is ``request``: raises
    :class:`BodyRetry` inside a delivery."""
    if request.called_directly or request.is_eager or not throw or not request._protected:
        return celery_retry(
            args=args,
            kwargs=kwargs,
            exc=exc,
            throw=throw,
            eta=eta,
            countdown=countdown,
            max_retries=max_retries,
            **options,
        )
    # The next message carries these, as Celery's retry would publish them.
    if args is not None:
        request.args = args
    if kwargs is not None:
        request.kwargs = kwargs
    if eta is not None:
        now = datetime.now(timezone.utc)
        countdown = max(0.0, (maybe_make_aware(eta) - now).total_seconds())
    cause = exc if exc is not None else sys.exc_info()[1]
    raise BodyRetry(cause, countdown, max_retries)
