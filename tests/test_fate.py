"""A delivery's fate against the no-loss promise, as a table: every row a situation (how the call
ended, the delivery, the task's options) and the fate it must get
(``celery_resilience/delivery/fate.py``), then what follows when carrying a fate out fails
(``fate.instead``), then the invariants over every situation at once: nothing is dropped, every
chain of failures ends.

Pure: no Redis, no broker, no worker. What the worker does with each fate is tested end to end
in ``tests/test_task_worker.py``, ``tests/test_time_limits.py`` and the fault matrix.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest
from celery.exceptions import Ignore, Reject, Retry, SoftTimeLimitExceeded, TimeLimitExceeded

from celery_resilience.backoff import Exponential
from celery_resilience.breaker.permit import Admission
from celery_resilience.config import BreakerConfig, ResilienceConfig
from celery_resilience.delivery.body_retry import BodyRetry
from celery_resilience.delivery.context import Options
from celery_resilience.delivery.ending import (
    AdmissionFailed,
    AlreadyDone,
    CeleryRaised,
    Claimed,
    Ending,
    KeptCopy,
    Limited,
    OwnError,
    ParkOn,
    Redelivered,
    Rejected,
    RetryAsked,
    Transient,
    body_ended,
    turned_down,
)
from celery_resilience.delivery.fate import (
    Facts,
    Fail,
    Fate,
    GiveUp,
    Keep,
    Park,
    Requeue,
    Skip,
    Wait,
    decide,
    instead,
)
from celery_resilience.delivery.fate import Retry as RetryIn
from celery_resilience.delivery.kept import KEPT_ERROR_HEADER, KEPT_HEADER, KEPT_REASON_HEADER
from celery_resilience.errors import BreakerOpen, BulkheadFull, RateLimited, TaskIdClaimed
from celery_resilience.headers import TURNED_AWAY_HEADER

pytestmark = pytest.mark.unit

CONFIG = ResilienceConfig(
    redis_url="memory://",
    max_countdown=3000.0,
    keep_delay=30.0,
    park_attempts=4,
    park_on_delay=60.0,
    breakers={"dep": BreakerConfig(open_timeout=5.0, open_timeout_max=20.0)},
)
#: 1, 2, 4, 8... seconds: no jitter, so every delay in the table is exact.
BACKOFF = Exponential(base=1.0, cap=10_000.0, jitter=None)
TASK = Options(max_retries=2, backoff=BACKOFF, on_open="park", breaker="dep")
RETRYING = dataclasses.replace(TASK, on_open="retry")
WORKER = Facts("t1")
EAGER = Facts("t1", eager=True)

DOWN = ConnectionError("gateway down")
BUG = ValueError("bad input")
NOT_NOW = LookupError("not now")
OPEN = BreakerOpen("dep", "open", retry_after=12.0)
OPEN_LONG = BreakerOpen("dep", "open", retry_after=4000.0)
FULL = BulkheadFull("dep", "closed")
LIMITED = RateLimited("dep", 3.0)
LIMITED_LONG = RateLimited("dep", 4000.0)
TROUBLE = OSError("store or broker down")
CELERY_RETRY = Retry()


def at(retries: int = 0, **fields: Any) -> Facts:
    """A worker's delivery of attempt ``retries``."""
    return dataclasses.replace(WORKER, retries=retries, **fields)


def shape(value: Any) -> Any:
    """Fates compare field by field; an exception by its type and arguments (a fate may make
    its own, as a claim's ``TaskIdClaimed``)."""
    if isinstance(value, BaseException):
        return type(value), value.args
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value), tuple(shape(getattr(value, f.name)) for f in dataclasses.fields(value))
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    return value


# -- decide: how the call ended -> the fate ------------------------------------------------------

ROWS: list[tuple[str, Ending, Facts, Options, Fate]] = [
    # Turned down at admission: the body does not run.
    (
        "a kept copy of a park parks at once without running the body",
        KeptCopy("retries_exhausted", ("ConnectionError", "gateway down")),
        at(2, failed_parks=1),
        TASK,
        Park("retries_exhausted", ("ConnectionError", "gateway down")),
    ),
    (
        "admission that failed keeps the message in the broker",
        AdmissionFailed(TROUBLE),
        WORKER,
        TASK,
        Keep(30.0, TROUBLE),
    ),
    (
        "admission that failed in eager mode fails the call: no broker to wait in",
        AdmissionFailed(TROUBLE),
        EAGER,
        TASK,
        Fail(TROUBLE),
    ),
    ("a task id that already succeeded is skipped", AlreadyDone(), WORKER, TASK, Skip()),
    (
        "a task id claimed by another delivery waits until that claim could end",
        Claimed(wait=4.0),
        WORKER,
        TASK,
        Wait(4.0, TaskIdClaimed("t1", 4.0)),
    ),
    (
        "a claim about to end is asked about again after half a second, not in a loop",
        Claimed(wait=0.01),
        WORKER,
        TASK,
        Wait(0.5, TaskIdClaimed("t1", 0.01)),
    ),
    (
        "a long claim is asked about again after resilience_keep_delay",
        Claimed(wait=600.0),
        WORKER,
        TASK,
        Wait(30.0, TaskIdClaimed("t1", 600.0)),
    ),
    (
        "a claimed task id in eager mode fails the call",
        Claimed(wait=4.0),
        EAGER,
        TASK,
        Fail(TaskIdClaimed("t1", 4.0)),
    ),
    (
        "a message delivered too often parks as redelivered",
        Redelivered(),
        WORKER,
        TASK,
        Park("redelivered", None),
    ),
    (
        "an open breaker parks at once with on_open park, no attempt used",
        Rejected(OPEN),
        at(1),
        TASK,
        Park("breaker_open", OPEN),
    ),
    (
        "an open breaker with on_open retry retries when the breaker may half-open",
        Rejected(OPEN),
        at(1),
        RETRYING,
        RetryIn(12.0, 2, OPEN),
    ),
    (
        "an open breaker with on_open retry and no retries left parks as breaker_open",
        Rejected(OPEN),
        at(2),
        RETRYING,
        Park("breaker_open", OPEN, 4.0),
    ),
    (
        "an open breaker with on_open retry whose wait is past max_countdown parks",
        Rejected(OPEN_LONG),
        at(0),
        RETRYING,
        Park("delay_too_long", OPEN_LONG, 4000.0),
    ),
    (
        "a full bulkhead spends no attempt, even on the last one, and counts the turn-away",
        Rejected(FULL),
        at(2),
        TASK,
        RetryIn(1.0, 2, FULL, {TURNED_AWAY_HEADER: 1}),
    ),
    (
        "each turn-away in a row waits the backoff of its count, within the retry range",
        Rejected(FULL),
        at(0, turned_away=5),
        TASK,
        RetryIn(4.0, 0, FULL, {TURNED_AWAY_HEADER: 6}),
    ),
    (
        "a turn-away waits no longer than its breaker's longest open time",
        Rejected(FULL),
        at(0, turned_away=9),
        dataclasses.replace(TASK, max_retries=9),
        RetryIn(20.0, 0, FULL, {TURNED_AWAY_HEADER: 10}),
    ),
    (
        "a full bulkhead in eager mode parks as breaker_open: nothing to wait in",
        Rejected(FULL),
        dataclasses.replace(EAGER, retries=0),
        TASK,
        Park("breaker_open", FULL),
    ),
    (
        "over the rate limit no attempt is spent, even on the last one: it waits its slot",
        Limited(LIMITED),
        at(2),
        TASK,
        RetryIn(3.0, 2, LIMITED, {TURNED_AWAY_HEADER: 1}),
    ),
    (
        "each turn-away by the rate in a row waits its slot or the backoff of its count",
        Limited(LIMITED),
        at(0, turned_away=5),
        TASK,
        RetryIn(4.0, 0, LIMITED, {TURNED_AWAY_HEADER: 6}),
    ),
    (
        "a slot of the rate past max_countdown waits max_countdown in the broker and asks again",
        Limited(LIMITED_LONG),
        at(0),
        TASK,
        RetryIn(3000.0, 0, LIMITED_LONG, {TURNED_AWAY_HEADER: 1}),
    ),
    (
        "over the rate limit in eager mode fails the call: nothing to wait in",
        Limited(LIMITED),
        EAGER,
        TASK,
        Fail(LIMITED),
    ),
    # The body ran.
    (
        "a transient error retries after the backoff as the next attempt",
        Transient(DOWN),
        at(1),
        TASK,
        RetryIn(2.0, 2, DOWN),
    ),
    (
        "an exhausted retry parks, due when its next retry would have run",
        Transient(DOWN),
        at(2),
        TASK,
        Park("retries_exhausted", DOWN, 4.0),
    ),
    (
        "max_retries None never exhausts",
        Transient(DOWN),
        at(11),
        dataclasses.replace(TASK, max_retries=None),
        RetryIn(2048.0, 12, DOWN),
    ),
    (
        "a delay past max_countdown parks as delay_too_long instead of sitting in the broker",
        Transient(DOWN),
        at(12),
        dataclasses.replace(TASK, max_retries=None),
        Park("delay_too_long", DOWN, 4096.0),
    ),
    (
        "a transient error in eager mode is Celery's eager retry",
        Transient(DOWN),
        dataclasses.replace(EAGER, retries=1),
        TASK,
        RetryIn(2.0, 2, DOWN, eager=True),
    ),
    (
        "a soft time limit retries like a transient error",
        Transient(SoftTimeLimitExceeded()),
        at(0),
        TASK,
        RetryIn(1.0, 1, SoftTimeLimitExceeded()),
    ),
    (
        "a hard time limit on the last attempt parks as retries_exhausted",
        Transient(TimeLimitExceeded(2.0)),
        at(2),
        TASK,
        Park("retries_exhausted", TimeLimitExceeded(2.0), 4.0),
    ),
    (
        "a full bulkhead met inside the body spends an attempt and parks as breaker_open",
        Transient(FULL),
        at(2),
        TASK,
        Park("breaker_open", FULL, 4.0),
    ),
    (
        "the body's own retry keeps its countdown and its own max_retries",
        RetryAsked(BUG, countdown=7.0, max_retries=5),
        at(3),
        TASK,
        RetryIn(7.0, 4, BUG),
    ),
    (
        "the body's own retry past its max_retries parks as retries_exhausted",
        RetryAsked(None, countdown=7.0, max_retries=1),
        at(1),
        TASK,
        Park("retries_exhausted", None, 2.0),
    ),
    (
        "the body's own retry without a countdown takes the task's backoff",
        RetryAsked(DOWN),
        at(0),
        TASK,
        RetryIn(1.0, 1, DOWN),
    ),
    (
        "the task's own error is Celery's FAILURE",
        OwnError(BUG),
        at(0),
        TASK,
        Fail(BUG),
    ),
    (
        "the body's own Celery Retry, Ignore or Reject goes to Celery as raised",
        CeleryRaised(CELERY_RETRY),
        at(0),
        TASK,
        Fail(CELERY_RETRY),
    ),
]


@pytest.mark.parametrize(
    ("ending", "delivery", "options", "fate"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS]
)
def test_each_situation_gets_its_fate(
    ending: Ending, delivery: Facts, options: Options, fate: Fate
) -> None:
    assert shape(decide(ending, delivery, options, CONFIG)) == shape(fate)


def test_a_park_on_entry_is_due_later_with_each_replay() -> None:
    # Given a park_on exception, on a first delivery and on a task replayed twice before
    dues = {
        replays: [decide(ParkOn(NOT_NOW), at(0, replays=replays), TASK, CONFIG) for _ in range(50)]
        for replays in (0, 2)
    }
    # Then each parks as park_on, due resilience_park_on_delay * 2**replays with equal jitter
    for replays, fates in dues.items():
        full = 60.0 * 2**replays
        for fate in fates:
            assert isinstance(fate, Park)
            assert (fate.reason, fate.cause) == ("park_on", NOT_NOW)
            assert full / 2 <= fate.due_in <= full


# -- instead: carrying a fate out failed -> the next fate --------------------------------------

INSTEAD: list[tuple[str, Fate, Facts, Fate]] = [
    (
        "a retry whose publish fails parks, due when it would have run",
        RetryIn(8.0, 3, DOWN),
        at(2),
        Park("delay_too_long", DOWN, 8.0),
    ),
    (
        "a turned-away delivery whose publish fails parks, due when it would have come back",
        RetryIn(4.0, 0, FULL, {TURNED_AWAY_HEADER: 3}),
        at(0, turned_away=2),
        Park("delay_too_long", FULL, 4.0),
    ),
    (
        "a park that fails is kept in the broker, as a copy that parks without running",
        Park("retries_exhausted", DOWN, 4.0),
        at(2),
        Keep(
            30.0,
            TROUBLE,
            {
                KEPT_HEADER: 1,
                KEPT_REASON_HEADER: "retries_exhausted",
                KEPT_ERROR_HEADER: "ConnectionError: gateway down",
            },
        ),
    ),
    (
        "each park of a kept copy that fails waits twice as long",
        Park("park_on", ("LookupError", "not now")),
        at(0, failed_parks=2),
        Keep(
            120.0,
            TROUBLE,
            {
                KEPT_HEADER: 3,
                KEPT_REASON_HEADER: "park_on",
                KEPT_ERROR_HEADER: "LookupError: not now",
            },
        ),
    ),
    (
        "the last park that fails gives up where a person sees it",
        Park("breaker_open", OPEN),
        at(0, failed_parks=3),
        GiveUp("breaker_open", 4, TROUBLE),
    ),
    (
        "a park that fails in eager mode fails the call",
        Park("retries_exhausted", DOWN, 4.0),
        dataclasses.replace(EAGER, retries=2),
        Fail(TROUBLE),
    ),
    (
        "a kept copy that fails to publish is requeued",
        Keep(30.0, TROUBLE),
        at(1),
        Requeue(TimeoutError("broker down"), TROUBLE),
    ),
    (
        "a claim's wait that fails to publish keeps the message",
        Wait(4.0, TaskIdClaimed("t1", 4.0)),
        at(0),
        Keep(30.0, TimeoutError("broker down")),
    ),
]


@pytest.mark.parametrize(
    ("fate", "delivery", "then"), [r[1:] for r in INSTEAD], ids=[r[0] for r in INSTEAD]
)
def test_each_failed_fate_is_followed_by_the_next(fate: Fate, delivery: Facts, then: Fate) -> None:
    trouble = TimeoutError("broker down") if isinstance(fate, (Keep, Wait)) else TROUBLE
    assert shape(instead(fate, trouble, delivery, CONFIG)) == shape(then)


def test_a_kept_copy_waits_no_longer_than_max_countdown() -> None:
    # Given a store that refused this task's park many times (attempts raised to allow it)
    config = dataclasses.replace(CONFIG, park_attempts=50)
    fate = instead(Park("park_on", NOT_NOW), TROUBLE, at(0, failed_parks=20), config)
    assert isinstance(fate, Keep)
    assert fate.delay == config.max_countdown


@pytest.mark.parametrize(
    "fate", [Skip(), Fail(BUG), Requeue(TROUBLE, DOWN), GiveUp("park_on", 4, TROUBLE)]
)
def test_a_fate_without_io_has_nothing_instead(fate: Fate) -> None:
    with pytest.raises(TypeError, match="cannot fail"):
        instead(fate, TROUBLE, WORKER, CONFIG)


# -- the invariants, over every situation -------------------------------------------------------

ENDINGS: list[Ending] = [
    KeptCopy("retries_exhausted", ("ConnectionError", "down")),
    AdmissionFailed(TROUBLE),
    AlreadyDone(),
    Claimed(4.0),
    Redelivered(),
    Rejected(OPEN),
    Rejected(OPEN_LONG),
    Rejected(FULL),
    Limited(LIMITED),
    Limited(LIMITED_LONG),
    RetryAsked(DOWN),
    RetryAsked(None, countdown=5000.0),
    ParkOn(NOT_NOW),
    Transient(DOWN),
    OwnError(BUG),
    CeleryRaised(CELERY_RETRY),
]
DELIVERIES = [
    dataclasses.replace(d, retries=r, failed_parks=f, turned_away=t)
    for d, r, f, t in itertools.product((WORKER, EAGER), (0, 2, 40), (0, 3), (0, 7))
]
OPTIONS = [
    dataclasses.replace(TASK, on_open=on_open, max_retries=m)
    for on_open, m in itertools.product(("park", "retry"), (0, 2, None))
]
#: A Celery FAILURE is what these endings are for: an error of the task's own, or Celery's own
#: control flow; an admission failure or a claim in eager mode, where the caller sees it.
FAILING = (OwnError, CeleryRaised)


def chain(ending: Ending, delivery: Facts, options: Options) -> list[Fate]:
    """The fates a delivery goes through when carrying out each one fails, to the last."""
    fates = [decide(ending, delivery, options, CONFIG)]
    while isinstance(fates[-1], (RetryIn, Park, Keep, Wait)) and not (
        isinstance(fates[-1], RetryIn) and fates[-1].eager
    ):
        fates.append(instead(fates[-1], TROUBLE, delivery, CONFIG))
        assert len(fates) < 10, fates
    return fates


@pytest.mark.parametrize("ending", ENDINGS, ids=lambda e: type(e).__name__)
def test_nothing_is_ever_dropped_whatever_fails(ending: Ending) -> None:
    for delivery, options in itertools.product(DELIVERIES, OPTIONS):
        # Given any situation, when every fate's carrying out fails in turn
        fates = chain(ending, delivery, options)
        last = fates[-1]
        # Then a worker's delivery ends stored, in the broker, or requeued; a FAILURE only for
        # the task's own error or when every park attempt failed (a person is told)
        if not delivery.eager and not isinstance(ending, FAILING):
            assert isinstance(last, (Requeue, GiveUp, Skip)), (ending, delivery, fates)
            assert not any(isinstance(f, Fail) for f in fates), fates
        # and in eager mode nothing is published or requeued: there is no broker
        if delivery.eager:
            published = [f for f in fates if isinstance(f, (Keep, Wait, Requeue))]
            assert published == []
            assert all(f.eager for f in fates if isinstance(f, RetryIn))
        # and a skip only for a task id that already succeeded
        assert isinstance(last, Skip) == isinstance(ending, AlreadyDone)
        # and a give-up only after resilience_park_attempts parks
        if isinstance(last, GiveUp):
            assert last.failed == delivery.failed_parks + 1 >= CONFIG.park_attempts


@pytest.mark.parametrize("ending", ENDINGS, ids=lambda e: type(e).__name__)
def test_a_worker_never_holds_a_message_past_max_countdown(ending: Ending) -> None:
    for delivery, options in itertools.product(DELIVERIES, OPTIONS):
        for fate in chain(ending, delivery, options):
            delay = getattr(fate, "countdown", getattr(fate, "delay", 0.0))
            assert delay <= CONFIG.max_countdown, (ending, delivery, fate)


# -- how the call ended ------------------------------------------------------------------------

JUDGED: list[tuple[BaseException, type, str]] = [
    (BodyRetry(DOWN, 3.0, 5), RetryAsked, "failure"),
    (BodyRetry(BUG, None, None), RetryAsked, "success"),
    (BodyRetry(SoftTimeLimitExceeded(), None, None), RetryAsked, "failure"),
    (CELERY_RETRY, CeleryRaised, "success"),
    (Ignore(), CeleryRaised, "success"),
    (Reject(), CeleryRaised, "success"),
    (NOT_NOW, ParkOn, "success"),
    (DOWN, Transient, "failure"),
    (SoftTimeLimitExceeded(), Transient, "failure"),
    (BUG, OwnError, "release"),
]


@pytest.mark.parametrize(
    ("exc", "kind", "outcome"),
    JUDGED,
    ids=[f"{type(e).__name__}-{k.__name__}" for e, k, _ in JUDGED],
)
def test_the_bodys_exception_is_judged_and_tells_the_breaker(
    exc: BaseException, kind: type, outcome: str
) -> None:
    ended = body_ended(exc, retry_on=(ConnectionError,), park_on=(LookupError,))
    assert ended is not None
    assert isinstance(ended, kind)
    assert ended.outcome == outcome


def test_park_on_wins_over_retry_on_and_a_systemexit_is_not_judged() -> None:
    both = KeyError("both")  # a LookupError listed in park_on and retry_on
    assert isinstance(body_ended(both, (KeyError,), (LookupError,)), ParkOn)
    assert body_ended(SystemExit(1), (ConnectionError,), ()) is None


def test_the_admissions_answer_says_why_the_body_does_not_run() -> None:
    assert turned_down(Admission(None, None)) is None
    assert turned_down(Admission(None, None, skip="done")) == AlreadyDone()
    assert turned_down(Admission(None, None, skip="claimed", wait=3.0)) == Claimed(3.0)
    assert turned_down(Admission(None, None, skip="redelivered")) == Redelivered()
    assert turned_down(Admission(None, OPEN)) == Rejected(OPEN)
    assert turned_down(Admission(None, LIMITED)) == Limited(LIMITED)


def test_a_fate_that_cannot_even_be_decided_requeues_the_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A broken runtime while deciding: the message goes back to the queue, never acked away."""
    from types import SimpleNamespace

    from celery import Celery

    from celery_resilience import ResilientTask
    from celery_resilience.delivery import pipeline

    app = Celery("fate-broken", broker="memory://", set_as_current=False)
    app.conf.resilience_redis_url = "memory://"

    @app.task(base=ResilientTask, bind=True, shared=False, name="fate.broken_runtime", breaker="x")
    def charge(self: Any) -> None:
        return None

    def broken(*args: Any) -> Any:
        raise RuntimeError("runtime broken")

    monkeypatch.setattr(pipeline, "decide", broken)
    request = SimpleNamespace(is_eager=False, id="t-1", retries=0, headers={}, delivery_info={})
    delivery = app.tasks["fate.broken_runtime"]._delivery(request)
    done = pipeline.end(delivery, Transient(ConnectionError("down")))
    assert isinstance(done, Requeue)
    assert str(done.trouble) == "runtime broken"
