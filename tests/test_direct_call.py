"""A ``ResilientTask`` that calls itself directly inside its body (``fib(n - 1) + fib(n - 2)``)
runs that call as ``celery.Task`` does: a plain call with a request of its own, never admitted,
counted as a delivery, marked done or parked; only the delivery around it is.

The tasks are those of ``tests/apps/canvasapp.py``: ``fib`` under every combination of the options
that act on a delivery (``acks_late``, ``deduplicate``, a breaker or none), beside the same body
on ``celery.Task``, which is what each must do. Each runs through ``apply()`` here and in a real
worker, as a first delivery and as one the broker flags redelivered (its second delivery, the
most ``resilience_max_deliveries`` allows there: a nested call counted as one more would park it).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery, Task, states

from celery_resilience import Resilience, ResilientTask
from celery_resilience.contrib.pytest import delete_prefix

from .apps.canvasapp import FIB_VARIANTS, PLAIN_FIB, fib_name, make_canvas_app
from .support.waiting import wait_for
from .support.worker_process import WorkerProcess

pytestmark = pytest.mark.integration

N, FIB_N, CALLS = 6, 8, 25  # fib(6) = 8, in 25 calls
REDELIVERED = {"redelivered": True}  # kombu's mark of a message delivered before
WAIT = 20.0


class DependencyDown(ConnectionError):
    """Transient: counted by the breaker, retried, parked when retries run out."""


def env_of(prefix: str, redis_url: str) -> dict[str, str]:
    return {
        "WORKERAPP_PREFIX": prefix,
        "WORKERAPP_QUEUE": f"{prefix}-queue",
        "WORKERAPP_REDIS": redis_url,
        "WORKERAPP_BROKER": redis_url,
    }


class Calls:
    """What every ``fib`` call recorded (``<P>:ran``), by delivery."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client, self.key = client, f"{prefix}:ran"

    def of(self, task_id: str) -> list[dict[str, Any]]:
        """The calls of one delivery: its own and its body's nested calls."""
        found = [json.loads(r) for r in self.client.lrange(self.key, 0, -1)]
        return [r for r in found if r.get("delivery") == task_id]

    def seen(self, task_id: str) -> list[tuple[Any, ...]]:
        """What each call of one delivery saw, without the task's name."""
        return [(r["n"], r["args"], r["called_directly"]) for r in self.of(task_id)]


@pytest.fixture
def app(key_prefix: str, redis_url: str) -> Iterator[Celery]:
    app = make_canvas_app(env_of(key_prefix, redis_url))
    yield app
    Resilience.for_app(app).runtime.close()
    app.close()


@pytest.fixture
def calls(app: Celery, redis_client: redis.Redis, key_prefix: str) -> Calls:
    return Calls(redis_client, key_prefix)


def apply(app: Celery, name: str, headers: Any = None, **options: Any) -> Any:
    return app.tasks[name].apply((N,), headers=headers, **options)


def calls_total(app: Celery) -> int:
    breaker = Resilience.for_app(app).breaker("dep")
    breaker.flush()  # successes counted in this process
    return int(breaker.snapshot()["calls_total"])


# -- apply() -------------------------------------------------------------------------------------


@pytest.mark.parametrize("headers", [None, REDELIVERED], ids=["first", "redelivered"])
@pytest.mark.parametrize(("acks_late", "deduplicate", "breaker"), FIB_VARIANTS)
def test_apply_runs_the_calls_a_body_makes_to_its_own_task_as_plain_calls(
    app: Celery,
    calls: Calls,
    acks_late: bool,
    deduplicate: bool,
    breaker: str | None,
    headers: dict[str, Any] | None,
) -> None:
    name = fib_name(acks_late, deduplicate, breaker)
    reference = apply(app, PLAIN_FIB, headers)
    before = calls_total(app)

    result = apply(app, name, headers)

    assert (result.state, result.result) == (states.SUCCESS, FIB_N)
    # Every call saw what the same body sees on celery.Task: its own arguments.
    assert len(calls.of(result.id)) == CALLS
    assert calls.seen(result.id) == calls.seen(reference.id)
    assert all(args == [n] for n, args, _ in calls.seen(result.id))
    assert Resilience.for_app(app).backout.count() == 0
    # One delivery, one call through the breaker.
    assert calls_total(app) - before == (1 if breaker else 0)
    if deduplicate:  # the delivery was marked done once, after its body: a duplicate is skipped
        again = apply(app, name, headers, task_id=result.id)
        assert again.state == states.IGNORED
        assert len(calls.of(result.id)) == CALLS


#: ``headers`` that are no mapping: Celery's request stack takes them, and reads nothing there.
NOT_MAPPINGS = [123, "text", [1, 2], 1.5, b"raw"]


@pytest.mark.parametrize("headers", NOT_MAPPINGS, ids=repr)
@pytest.mark.parametrize(("acks_late", "deduplicate", "breaker"), FIB_VARIANTS)
def test_apply_with_headers_that_are_no_mapping_runs_as_celery_task_does(
    app: Celery,
    calls: Calls,
    acks_late: bool,
    deduplicate: bool,
    breaker: str | None,
    headers: Any,
) -> None:
    # given: the same body on celery.Task, applied with headers that are no mapping
    reference = apply(app, PLAIN_FIB, headers)
    assert (reference.state, reference.result) == (states.SUCCESS, FIB_N)

    # when: every variant of ResilientTask is applied with them
    result = apply(app, fib_name(acks_late, deduplicate, breaker), headers)

    # then: it runs as celery.Task does, its nested direct calls included
    assert (result.state, result.result) == (states.SUCCESS, FIB_N)
    assert calls.seen(result.id) == calls.seen(reference.id)
    assert Resilience.for_app(app).backout.count() == 0


@pytest.mark.parametrize("headers", NOT_MAPPINGS, ids=repr)
def test_a_body_that_applies_its_own_task_inside_such_headers_runs_as_celery_task_does(
    app: Celery, headers: Any
) -> None:
    def countdown_on(base: type[Task]) -> Any:
        @app.task(base=base, bind=True, shared=False, lazy=False, deduplicate=True, breaker="dep")
        def countdown(self: Any, n: int) -> list[Any]:
            if n == 0:
                return [self.request.headers]
            inner = countdown.apply((n - 1,), headers=self.request.headers)  # a nested apply()
            return [n, inner.state, *inner.result, *countdown(0)]  # and a direct call

        return countdown

    # given: the body on celery.Task, whose direct calls see the headers or not by Celery's
    # release (5.4 pushes a bare request for a direct call, 5.5 and later copy the delivery's)
    reference = countdown_on(Task).apply((2,), headers=headers)
    assert reference.state == states.SUCCESS, reference.traceback
    assert reference.result[:5] == [2, states.SUCCESS, 1, states.SUCCESS, headers]

    # when: the same body runs on ResilientTask
    result = countdown_on(ResilientTask).apply((2,), headers=headers)

    # then: it sees what celery.Task's body sees, nested apply and direct call alike
    assert result.state == states.SUCCESS, result.traceback
    assert result.result == reference.result


def test_an_exception_of_a_nested_call_is_the_body_s_own_to_catch(app: Celery) -> None:
    @app.task(
        base=ResilientTask, bind=True, shared=False, lazy=False, breaker="dep", acks_late=True,
        retry_on=(DependencyDown,), park_on=(LookupError,), deduplicate=True,
    )  # fmt: skip
    def lookup(self: Any, n: int) -> str:
        if n == 0:
            raise DependencyDown("down")
        if n == 1:
            raise LookupError("not now")
        try:
            return str(lookup(n - 2))
        except (DependencyDown, LookupError) as exc:  # a fallback, as in plain Celery
            return f"fallback after {type(exc).__name__}"

    before = calls_total(app)
    results = [lookup.apply((n,)) for n in (2, 3)]

    assert [r.result for r in results] == [
        "fallback after DependencyDown",
        "fallback after LookupError",
    ]
    assert [r.state for r in results] == [states.SUCCESS] * 2
    assert Resilience.for_app(app).backout.count() == 0
    snap = Resilience.for_app(app).breaker("dep").snapshot()
    assert (calls_total(app) - before, snap["failures_total"]) == (2, 0)


def test_a_nested_failure_left_uncaught_is_the_deliverys_retried_then_parked_once(
    app: Celery,
) -> None:
    @app.task(
        base=ResilientTask, bind=True, shared=False, lazy=False, breaker="dep",
        retry_on=(DependencyDown,), max_retries=0,
    )  # fmt: skip
    def walk(self: Any, n: int) -> int:
        if n == 0:
            raise DependencyDown("down")
        return int(walk(n - 1))

    before = calls_total(app)
    result = walk.apply((3,))

    assert result.state == states.IGNORED  # parked
    [entry] = Resilience.for_app(app).backout.list()
    assert (entry.task_id, entry.args, entry.reason) == (result.id, [3], "retries_exhausted")
    assert entry.exc_type.endswith("DependencyDown")
    snap = Resilience.for_app(app).breaker("dep").snapshot()
    assert (calls_total(app) - before, snap["failures_total"]) == (1, 1)  # one delivery


# -- a real worker -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_a_worker_runs_the_calls_a_body_makes_to_its_own_task_as_plain_calls(
    redis_url: str, tmp_path: Path, pool: str
) -> None:
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    env = env_of(prefix, redis_url)
    app = make_canvas_app(env)
    client = redis.Redis.from_url(redis_url)
    calls = Calls(client, prefix)
    worker = WorkerProcess(env, tmp_path / "worker.log", pool=pool, app="tests.apps.canvasapp")
    try:
        worker.start()
        names = [fib_name(*variant) for variant in FIB_VARIANTS]
        sent = {
            (name, kind): app.tasks[name].apply_async((N,), headers=headers)
            for name in [PLAIN_FIB, *names]
            for kind, headers in (("first", None), ("redelivered", REDELIVERED))
        }
        for (name, kind), result in sent.items():
            assert result.get(timeout=WAIT) == FIB_N, (name, kind)
        reference = calls.seen(sent[PLAIN_FIB, "first"].id)
        assert len(reference) == CALLS
        for key, result in sent.items():
            assert calls.seen(result.id) == reference, key
        assert Resilience.for_app(app).backout.count() == 0

        # A task id marked done once, by its delivery: the same message again is skipped.
        dedup = [fib_name(*v) for v in FIB_VARIANTS if v[1]]  # deduplicate=True
        for name in dedup:
            done = sent[name, "first"].id
            app.tasks[name].apply_async((N,), task_id=done)
            wait_for(
                lambda done=done: f"[{done}] already succeeded: skipped" in worker.log(),  # type: ignore[misc]
                f"{done} to be skipped",
                WAIT,
            )
            assert len(calls.of(done)) == CALLS
    finally:
        print(f"===== worker log\n{worker.stop()}")
        Resilience.for_app(app).runtime.close()
        app.close()
        delete_prefix(client, prefix)
        client.close()
