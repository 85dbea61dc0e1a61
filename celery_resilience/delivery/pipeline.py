"""The way one delivery goes, from its admission to its end.

``ResilientTask`` hands each delivery here and runs the body in between:

1. :func:`admit`: a kept copy of a failed park goes straight to parking, its body not run; else
   the breaker's permit and the delivery questions (``admission.py``). ``None``: the body runs;
   else how it was turned down (``ending.py``).
2. the body runs, no lock taken around it;
3. :func:`succeeded`, or :func:`body_ended`: the claim on the task id given back, the body's
   exception judged (``ending.py``) and the breaker's permit settled with its outcome
   (``settle.py``);
4. :func:`end`, for whatever did not succeed: the fate decided as a value (``fate.py``; a
   retry of a failed call asks its breaker's retry budget, which may turn it into a park), then
   carried out (``carry_out.py``). The fate carried out is returned, and the task ends the call
   the way Celery reads it. A hard time limit ends a delivery the same way, from the worker's
   main process (``time_limits.py``).
"""

from __future__ import annotations

from ..headers import parked_span_of
from ..redact import get_logger
from . import dedup, kept
from .admission import admission
from .breaker_key import breaker_of
from .carry_out import carry_out
from .context import Delivery
from .dedup_key import key_of
from .ending import (
    AdmissionFailed,
    AlreadyDone,
    BodyEnded,
    Claimed,
    Ending,
    KeptCopy,
    TurnedDown,
    turned_down,
)
from .ending import body_ended as judged
from .fate import Facts, Fate, Requeue, Retry, budgeted, decide
from .settle import settle

logger = get_logger("celery_resilience.task")


def admit(delivery: Delivery) -> TurnedDown | None:
    """Why ``delivery``'s body does not run, or ``None``: it runs, under the permit and the
    claim its admission took (kept on ``delivery``)."""
    request = delivery.request
    if copy := kept.kept_park(request):  # a park failed: park again, body not run
        return KeptCopy(copy[0], copy[1:])
    tracing = delivery.runtime.tracing
    try:
        if tracing is None:  # the common case: no span, nothing more asked
            admitted = admission(delivery)
        else:
            admitted = tracing.admission(
                delivery.task.name,
                request.id,
                breaker_of(delivery) or delivery.options.breaker,
                parked_span_of(request),
                lambda: admission(delivery),
            )
    except Exception as exc:  # our own machinery failed before the body ran
        logger.exception("Admission of %s[%s] failed", delivery.task.name, request.id)
        return AdmissionFailed(exc)
    delivery.permit, delivery.claim = admitted.permit, admitted.claim
    ended = turned_down(admitted)
    if isinstance(ended, (AlreadyDone, Claimed)) and (key := key_of(delivery)):
        # A dedup key's ending names the key; a key done asks which task id it succeeded as
        # (one more round trip, only then): this one may be a duplicate of another id.
        if isinstance(ended, Claimed):
            return Claimed(ended.wait, key)
        return AlreadyDone(dedup.done_by(delivery), key)
    return ended


def body_ended(delivery: Delivery, exc: BaseException) -> BodyEnded | None:
    """The body raised ``exc``: the claim given back first (a retry or a replay of the
    delivery finds the task id free), then the exception judged and the permit settled with
    its outcome. ``None``: not ours to judge (``SystemExit`` and the like)."""
    dedup.give_back(delivery, delivery.claim)
    options = delivery.options
    ended = judged(exc, options.retry_on, options.park_on)
    if ended is not None:
        settle(delivery.permit, ended.outcome, getattr(ended, "retry_after", None))
    return ended


def succeeded(delivery: Delivery) -> None:
    """The body returned: the permit settled as a success; the task id marked done
    (``deduplicate``), which replaces its claim."""
    settle(delivery.permit, "success")
    if delivery.options.deduplicate:
        dedup.mark_done(delivery)


def end(delivery: Delivery, ending: Ending) -> Fate:
    """The fate of ``delivery`` after ``ending``, decided, then carried out: the one carried
    out. When even deciding fails (a broken runtime), ``Requeue``: the message stays in the
    broker (in eager mode, where there is none, the error is raised)."""
    request = delivery.request
    try:
        facts = Facts.of(request)
        config = delivery.runtime.config
        decided = decide(ending, facts, delivery.options, config)
        if isinstance(decided, Retry) and decided.spends:
            decided = budgeted(decided, _retry_allowed(delivery))
    except Exception as trouble:
        if request.is_eager:
            raise
        logger.exception(
            "Could not decide the fate of %s[%s]: requeued", delivery.task.name, request.id
        )
        return Requeue(trouble, trouble)
    return carry_out(delivery, decided, facts, config)


def _retry_allowed(delivery: Delivery) -> bool:
    """Whether the breaker's retry budget grants the delivery's retry (one round trip)."""
    options = delivery.options
    assert options.breaker is not None  # only a retry through a breaker spends
    return delivery.runtime.breaker(breaker_of(delivery) or options.breaker).retry_allowed()
