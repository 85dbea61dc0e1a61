"""A retry's ``task-retried`` goes out before the retry does.

Celery sends ``task-retried`` from the worker's main process once the pool child's result came
back; by then the child has published the retry, which another child may have run to its end.
Celery's event state lets a late RETRY override any state, so Flower would show a parked (or
succeeded) task as RETRY for good. Where the main process sends task events for a delivery, it
tells the child so (``headers.TASK_EVENTS_HEADER``), the child sends ``task-retried`` before it
publishes the retry, and the main process sends none (``ResilientRequest.on_retry``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.app.task import Context
from celery.contrib.testing.mocks import TaskMessage
from celery.exceptions import Retry
from celery.utils.objects import Bunch

from celery_resilience import ResilientTask
from celery_resilience.delivery import carry_out
from celery_resilience.delivery.fate import Facts, Fail, Keep
from celery_resilience.delivery.fate import Retry as RetryFate
from celery_resilience.events import send_task_retried
from celery_resilience.headers import TASK_EVENTS_HEADER, new_message_headers
from celery_resilience.task import ResilientRequest

pytestmark = pytest.mark.unit

TASK = f"{__name__}.charge"


class Eventer:
    """The worker's event dispatcher, recording what the main process sends."""

    def __init__(self, enabled: bool, groups: list[str] | None = None) -> None:
        self.enabled = enabled
        self.groups = groups
        self.sent: list[str] = []

    def send(self, type_: str, **fields: Any) -> None:
        self.sent.append(type_)


@pytest.fixture
def app() -> Celery:
    app = Celery("t", broker="memory://", set_as_current=False)
    app.conf.resilience_redis_url = "memory://"  # the stores in this process
    app.finalize()
    return app


def make_task(app: Celery, acks_late: bool = False) -> Any:
    def charge(self: Any, order_id: str) -> str:
        return order_id

    return app.task(base=ResilientTask, bind=True, shared=False, name=TASK, acks_late=acks_late)(
        charge
    )


def request_of(
    app: Celery, task: Any, eventer: Eventer, **headers: Any
) -> tuple[ResilientRequest, list[bool]]:
    """The main process's request of a delivery of ``task``, and its record of acks."""
    acked: list[bool] = []
    request = ResilientRequest(
        TaskMessage(TASK, id="t-1", args=("o-1",), **headers),
        app=app,
        eventer=eventer,
        task=task,
        on_ack=lambda *_: acked.append(True),
    )
    return request, acked


def retry_info() -> Any:
    """What the pool hands the main process for a task that raised ``Retry``."""
    try:
        raise Retry(exc=ConnectionError("down"), when=0.1)
    except Retry as exc:
        return Bunch(exception=exc, traceback="Traceback...", type=Retry)


@pytest.mark.parametrize("acks_late", [False, True])
def test_with_task_events_on_the_main_process_sends_no_task_retried_of_its_own(
    app: Celery, acks_late: bool
) -> None:
    eventer = Eventer(enabled=True)
    request, acked = request_of(app, make_task(app, acks_late), eventer)
    assert request._request_dict[TASK_EVENTS_HEADER] == 1  # the child is told to send it

    request.on_retry(retry_info())

    assert "task-retried" not in eventer.sent
    assert acked == ([True] if acks_late else [])


def test_with_task_events_off_the_child_is_told_nothing_and_celery_handles_the_retry(
    app: Celery,
) -> None:
    eventer = Eventer(enabled=False)
    request, acked = request_of(app, make_task(app, acks_late=True), eventer)
    assert TASK_EVENTS_HEADER not in request._request_dict

    request.on_retry(retry_info())

    assert eventer.sent == []  # Celery's own handler: events are off
    assert acked == [True]


@pytest.mark.parametrize(
    "eventer",
    [Eventer(enabled=False), Eventer(enabled=True, groups=["worker"])],
    ids=["events off", "worker events only (no -E)"],
)
def test_a_mark_the_message_carries_is_dropped_where_task_events_are_off(
    app: Celery, eventer: Eventer
) -> None:
    # Celery's own retry publishes the request's headers: the mark may come with a message.
    request, _ = request_of(app, make_task(app), eventer, **{TASK_EVENTS_HEADER: 1})
    assert TASK_EVENTS_HEADER not in request._request_dict


def test_the_header_describes_one_delivery_and_is_never_published() -> None:
    assert new_message_headers({TASK_EVENTS_HEADER: 1, "keep": "me"}) == {"keep": "me"}


class Recorder:
    """What the child does, in order: its events sent and its retry published."""

    def __init__(self, task: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.done: list[str] = []
        self.fields: dict[str, Any] = {}

        def send_event(type_: str, **fields: Any) -> None:
            self.done.append(type_)
            self.fields = fields

        def send_again(*args: Any, **kwargs: Any) -> None:
            self.done.append("published")

        monkeypatch.setattr(task, "send_event", send_event)
        monkeypatch.setattr(carry_out, "_send_again", send_again)


@contextlib.contextmanager
def in_child(
    app: Celery, monkeypatch: pytest.MonkeyPatch, events: bool
) -> Iterator[tuple[Any, Recorder, Any]]:
    """A task, the record of what it does, and its delivery as a pool child sees it, the
    request on the task's stack meanwhile."""
    task = make_task(app)
    recorder = Recorder(task, monkeypatch)
    headers = {TASK_EVENTS_HEADER: 1} if events else {}
    request = Context(id="t-1", args=["o-1"], kwargs={}, is_eager=False, **headers)
    task.request_stack.push(request)
    try:
        yield task, recorder, task._delivery(request)
    finally:
        task.request_stack.pop()


@pytest.mark.parametrize(
    "fate",
    [
        RetryFate(0.1, 1, ConnectionError("down")),
        Keep(30.0, ConnectionError("store down")),
    ],
    ids=["retry", "kept copy"],
)
def test_the_child_sends_task_retried_before_it_publishes_the_retry(
    app: Celery, monkeypatch: pytest.MonkeyPatch, fate: Any
) -> None:
    with in_child(app, monkeypatch, events=True) as (_, recorder, delivery):
        carry_out.carry_out(delivery, fate, Facts("t-1"), delivery.runtime.config)
    assert recorder.done == ["task-retried", "published"]
    assert recorder.fields["exception"] == repr(fate.cause)
    assert "ConnectionError" in recorder.fields["traceback"]


def test_without_task_events_the_child_sends_none(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    with in_child(app, monkeypatch, events=False) as (task, recorder, delivery):
        send_task_retried(task, ConnectionError("down"))
        fate = RetryFate(0.1, 1, ConnectionError("down"))
        carry_out.carry_out(delivery, fate, Facts("t-1"), delivery.runtime.config)
    assert recorder.done == ["published"]


def test_a_delivery_sends_one_task_retried_at_most(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A retry that could not be published becomes a kept copy, published after its own event.
    with in_child(app, monkeypatch, events=True) as (task, recorder, _):
        send_task_retried(task, ConnectionError("down"))
        send_task_retried(task, ConnectionError("store down"))
    assert recorder.done == ["task-retried"]


def test_a_body_that_raises_celerys_retry_itself_sends_task_retried(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (``raise self.retry(throw=False)`` and the like: published by Celery, not by the package;
    # the main process sends no event of its own)
    with (
        in_child(app, monkeypatch, events=True) as (task, recorder, delivery),
        pytest.raises(Retry),
    ):
        task._end(delivery, Fail(Retry(exc=ConnectionError("down"), when=1.0)))
    assert recorder.done == ["task-retried"]
    assert recorder.fields["exception"] == repr(ConnectionError("down"))
