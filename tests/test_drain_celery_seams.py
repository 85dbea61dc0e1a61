"""What the drain does so that a replay behaves the same on every tested Celery (5.4 to 5.7), in
a process that also waits on results or whose current app is another one: a CLI, a web process,
a test. Real Redis broker and result backend, no worker: the test stores the results itself.

The failures these tests guard against are those of the older Celery versions (tox's ``oldest``
corner); on Celery 5.7 they would pass without the package's help too.
"""

from __future__ import annotations

import gc
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, _state, states
from celery.result import AsyncResult, GroupResult

from celery_resilience import ParkedTask, Resilience
from celery_resilience.drain.dead_task import current, fail_task
from celery_resilience.drain.message import publish

pytestmark = pytest.mark.integration


@pytest.fixture
def resilience(redis_url: str, key_prefix: str) -> Iterator[Resilience]:
    app = Celery("seams", broker=redis_url, backend=redis_url, set_as_current=False)
    app.conf.task_default_queue = f"{key_prefix}-queue"
    app.conf.result_backend_transport_options = {"global_keyprefix": f"{key_prefix}:"}
    app.conf.resilience_key_prefix = key_prefix
    resilience = Resilience(app)
    yield resilience
    resilience.runtime.close()
    app.close()


def replay(resilience: Resilience, task_id: str) -> None:
    """The drain's publish of a parked ``seams.member``; its result handle is dropped at once."""
    entry = ParkedTask.new(task_name="seams.member", task_id=task_id, reason="breaker_open")
    publish(resilience.runtime, entry)
    gc.collect()


def test_a_replay_leaves_the_subscription_of_a_group_waiting_on_its_id(
    resilience: Resilience,
) -> None:
    app, task_id = resilience.runtime.app, str(uuid.uuid4())
    waiting = GroupResult(str(uuid.uuid4()), [AsyncResult(task_id, app=app)], app=app)

    replay(resilience, task_id)
    app.backend.store_result(task_id, 42, states.SUCCESS)  # the replayed member ran

    assert waiting.get(timeout=5) == [42]


def test_a_replay_nobody_waits_on_leaves_no_subscription(
    resilience: Resilience, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, task_id = resilience.runtime.app, str(uuid.uuid4())
    consumer = app.backend.result_consumer
    subscribed: list[str] = []
    consume_from = consumer.consume_from

    def subscribing(task_id: str) -> None:
        subscribed.append(task_id)
        consume_from(task_id)

    monkeypatch.setattr(consumer, "consume_from", subscribing)

    replay(resilience, task_id)

    # Celery's own: send_task subscribed to the id's result, the dropped handle ended it.
    assert subscribed == [task_id]
    assert bytes(app.backend.get_key_for_task(task_id)) not in consumer.subscribed_to


def test_a_dead_task_is_failed_with_its_app_as_the_current_one(
    resilience: Resilience, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = resilience.runtime
    before = _state._tls.current_app  # this thread's own (None: none was set)
    current_while_failing: list[Any] = []

    def mark_as_failure(*args: Any, **kwargs: Any) -> None:
        current_while_failing.append(_state._tls.current_app)

    monkeypatch.setattr(runtime.app.backend, "mark_as_failure", mark_as_failure)
    entry = ParkedTask.new(task_name="seams.member", task_id="t-1", reason="breaker_open")

    fail_task(runtime, entry, "max_replays")

    assert current_while_failing == [runtime.app]
    assert _state._tls.current_app is before


def test_the_current_app_is_given_back_when_failing_raised(resilience: Resilience) -> None:
    app = resilience.runtime.app
    before = _state._tls.current_app

    with pytest.raises(RuntimeError), current(app):
        raise RuntimeError("trouble in the block")

    assert _state._tls.current_app is before
