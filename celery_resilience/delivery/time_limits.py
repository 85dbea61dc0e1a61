"""A hard time limit, the package's way: the task is retried or parked, never acked away.

Celery kills a pool child whose task ran past ``time_limit`` and handles the end in the worker's
main process (``Request.on_failure`` with ``TimeLimitExceeded``, then ``Request.on_timeout``):
it marks FAILURE and, with ``acks_late``, acks the message. ``ResilientTask``'s ``Request``
class (``ResilientRequest``, beside it in ``task.py``) hands the delivery here instead:
:func:`timed_out` counts a breaker failure (the dependency hung) and gives the delivery the
fate of a call that hung, by the pipeline's one way (``pipeline.end``: decided by ``fate.py``,
carried out by ``carry_out.py``, from the main process): published again (same id,
``retries + 1``, the task's backoff), or parked when retries run out or the publish fails
(reasons ``retries_exhausted`` / ``delay_too_long``, ``exc_type``
``billiard.exceptions.TimeLimitExceeded``); when the park fails, a kept copy (``kept.py``) or, if
the broker refuses even that, a requeue. The message is acked only after one of these was
carried out.

Billiard runs that handler *before* it kills the pool child: the body would still be running
while the handler talks to Redis and the broker, and a handler stalled past the claim's lease
would let a copy of the task start beside it. So the handler kills the child first, by its PID
(:func:`kill_child`): whatever follows happens once the body is gone.

The main process also knows when a pool child dies mid-task (``kill -9``, the OOM killer: a
``WorkerLostError``), before Celery requeues its message. A delivery's claim on its task id
(``deduplicate``) and its bulkhead slot or probe are taken in Redis under a token the main
process gives each delivery (:data:`~celery_resilience.headers.DELIVERY_HEADER`): when the
child that took them is gone, for a time limit or for a loss (:func:`lost`), the main process
gives the claim back and releases the permit at once, and the requeued message or the retry
runs without waiting for their leases. A body that had its effect before it was killed runs
again then: make such effects idempotent (the task id as the dependency's idempotency key).

A soft time limit raises ``SoftTimeLimitExceeded`` inside the body: the task handles it there.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import weakref

from celery.exceptions import TimeLimitExceeded

from ..breaker.permit import Permit
from ..headers import delivery_token
from ..redact import get_logger
from ..runtime import Runtime
from .breaker_key import breaker_of
from .context import Delivery
from .dedup_key import key_of
from .ending import Transient
from .fate import Fate
from .pipeline import end

logger = get_logger("celery_resilience.task")
#: Seconds the main process stops freeing what dead pool children held after Redis failed to
#: answer (their leases end it meanwhile).
FREE_PAUSE = 5.0
_paused: weakref.WeakKeyDictionary[Runtime, float] = weakref.WeakKeyDictionary()


def kill_child(pid: int | None) -> None:
    """SIGKILL the pool child ``pid`` running a delivery (billiard then finds it dead); nothing
    for a pool that runs tasks in this process."""
    if not pid or pid == os.getpid():
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def timed_out(delivery: Delivery, exc: TimeLimitExceeded) -> Fate:
    """The pool child running ``delivery`` was killed at its hard time limit: its claim given
    back, the call counted as a breaker failure (which releases its bulkhead slot), and the fate
    of a call that hung carried out; the fate carried out."""
    _free(delivery, judged=True)
    _record_failure(delivery)
    return end(delivery, Transient(exc))


def lost(delivery: Delivery) -> None:
    """The pool child running ``delivery`` died mid-task (``WorkerLostError``): its claim given
    back and its permit released at once, before Celery requeues the message."""
    _free(delivery, judged=False)


def _free(delivery: Delivery, judged: bool) -> None:
    """What the delivery of a dead pool child took under its token: its claim on the task id
    given back, then its permit's bulkhead slot or probe released (unless ``judged``: the
    failure recorded next frees the slot). At once, from the worker's main process;
    bookkeeping never changes the task's fate (the leases end them anyway). While Redis fails
    to answer, it is not asked again for :data:`FREE_PAUSE` seconds: a pool that loses many
    children at once (the OOM killer) would hold the main process one Redis timeout each."""
    token = delivery_token(delivery.request)
    options, runtime = delivery.options, delivery.runtime
    release = options.breaker is not None and not judged
    if not token or not (options.deduplicate or release):
        return
    paused_until = _paused.get(runtime, 0.0)
    if time.monotonic() < paused_until:
        return
    name, task_id = delivery.task.name, delivery.request.id
    try:
        if options.deduplicate:
            runtime.guard.unclaim(options.breaker, task_id, token, key_of(delivery))
        if release and (breaker := breaker_of(delivery) or options.breaker):
            runtime.breaker(breaker).release_lost(token)
    except Exception as exc:
        _paused[runtime] = time.monotonic() + FREE_PAUSE
        logger.error(
            "Could not free the claim or permit of %s[%s] (%s: %s): their leases end them; "
            "not asked again for %.0fs",
            name,
            task_id,
            type(exc).__name__,
            exc,
            FREE_PAUSE,
        )


def _record_failure(delivery: Delivery) -> None:
    """A breaker failure for the call the kill ended (its permit died with the pool child).

    Recorded under the delivery's token as the kind of permit it held (``"lost"``): a bulkhead
    slot it took is freed, and a killed half-open probe is a failed probe (the breaker opens
    again at once, its lease freed)."""
    options = delivery.options
    if options.breaker is None:
        return
    try:
        breaker = delivery.runtime.breaker(breaker_of(delivery) or options.breaker)
        Permit(breaker, "lost", delivery_token(delivery.request)).failure()
    except Exception:  # bookkeeping never changes the task's fate
        logger.exception("Could not record the time limit of %s as a failure", delivery.task.name)
