"""A sensitive argument passed by position, quoted by the dependency's error, shows on no surface
a parked task reaches: the result backend (``PARKED`` meta), the ``task-parked`` event, the
worker's log (the retry and the park, Celery's own lines included), ``celery resilience list``
and ``show`` (text and ``--json``). The store alone keeps it whole.

A real ``celery worker`` (solo, task events on: ``tests/apps/flowerapp.py``) runs
``workerapp.charge(order_id)`` with ``resilience_sensitive_keys = ["order_id"]`` against a
dependency that is down and answers ``dependency down (order <order_id>)``: one retry, then each
order is parked ``retries_exhausted``. Once without an encryption key (the default
``resilience_error_text`` is ``"masked"``) and once with one (the default is ``"type"``).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.result import AsyncResult
from cryptography.fernet import Fernet

from celery_resilience import Resilience

from .apps.flowerapp import make_app
from .apps.workerapp import broker_keyprefix
from .support import cli_forks
from .support.waiting import wait_for
from .support.worker_process import WorkerProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
ORDERS = 3


class EventTap:
    """Every event of the app's broker, captured in a thread from before the first is sent."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.events: list[dict[str, Any]] = []
        self.connection = app.connection_for_read()
        self.receiver = app.events.Receiver(self.connection, handlers={"*": self.events.append})
        self.thread = threading.Thread(target=self.receiver.capture, kwargs={"wakeup": False})

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in list(self.events) if e.get("type") == kind]

    def __enter__(self) -> EventTap:
        self.thread.start()
        probe = f"probe-{uuid.uuid4().hex}"

        def heard() -> bool:  # a subscription starts a moment after the consumer does
            with self.app.events.default_dispatcher() as dispatcher:
                dispatcher.send("resilience-test-probe", probe=probe)
            return any(e.get("probe") == probe for e in list(self.events))

        wait_for(heard, "the event tap hears events", 30.0, poll=0.5)
        return self

    def __exit__(self, *exc: object) -> None:
        self.receiver.should_stop = True
        self.thread.join(10)
        self.connection.release()


def cli(env: dict[str, str], *args: str) -> str:
    process = cli_forks.celery(["-A", "tests.apps.workerapp", "resilience", *args], env)
    stdout, stderr = process.communicate(timeout=180)
    assert process.returncode == 0, f"{args}: {stdout}\n{stderr}"
    return stdout


@pytest.fixture
def world(
    request: pytest.FixtureRequest, redis_url: str, redis_client: redis.Redis, key_prefix: str
) -> Iterator[dict[str, str]]:
    env = {
        "WORKERAPP_PREFIX": key_prefix,
        "WORKERAPP_QUEUE": f"{key_prefix}-queue",
        "WORKERAPP_BROKER": redis_url,
        "WORKERAPP_FAILURE_THRESHOLD": "100",  # every order runs: its own error is parked
        "WORKERAPP_MAX_RETRIES": "1",
        "WORKERAPP_BACKOFF_BASE": "0.05",
        "WORKERAPP_SENSITIVE_KEYS": "order_id",
    }
    if request.param:
        env["WORKERAPP_ENCRYPTION_KEY"] = Fernet.generate_key().decode()
    redis_client.set(f"{key_prefix}:dep:up", "0")
    yield env
    queue = env["WORKERAPP_QUEUE"]
    redis_client.delete(queue, f"_kombu.binding.{queue}")
    for key in redis_client.scan_iter(match=f"{broker_keyprefix(key_prefix)}*"):
        redis_client.delete(key)


@pytest.mark.parametrize("world", [False, True], ids=["clear", "encrypted"], indirect=True)
def test_a_sensitive_argument_passed_by_position_shows_on_no_surface(
    world: dict[str, str], tmp_path: Path
) -> None:
    encrypted = "WORKERAPP_ENCRYPTION_KEY" in world
    app = make_app(world)
    res = Resilience.for_app(app)
    worker = WorkerProcess(world, tmp_path / "worker.log", app="tests.apps.flowerapp")
    orders = [f"order-{uuid.uuid4().hex}" for _ in range(ORDERS)]
    try:
        with EventTap(app) as tap:
            worker.start()
            ids = [app.tasks["workerapp.charge"].delay(order).id for order in orders]
            wait_for(lambda: res.backout.count() == ORDERS, "every order parked", 60.0)
            wait_for(
                lambda: len(tap.of_type("task-parked")) == ORDERS, "every task-parked event", 30.0
            )
        metas = {i: AsyncResult(i, app=app) for i in ids}
        wait_for(lambda: all(r.state == "PARKED" for r in metas.values()), "PARKED", 30.0)
        task_id = ids[0]
        surfaces = {
            "meta": repr([r.info for r in metas.values()]),
            "events": repr(tap.of_type("task-parked")),
            "list": cli(world, "list"),
            "list --json": cli(world, "list", "--json"),
            "show": cli(world, "show", task_id),
            "show --json": cli(world, "show", task_id, "--json"),
        }
        kept = res.backout.list()
    finally:
        surfaces_log = worker.stop()
        res.runtime.close()
        app.close()
    surfaces["worker log"] = surfaces_log
    assert "Parked workerapp.charge" in surfaces["worker log"]
    assert "retry 1/1" in surfaces["worker log"]
    for name, text in surfaces.items():
        assert not [o for o in orders if o in text], f"an order id shows in {name}:\n{text}"

    # What was said instead: the type alone with an encryption key, the masked text without.
    meta = metas[task_id].info
    event = tap.of_type("task-parked")[0]
    assert meta["exc_type"].endswith("ConnectionError")
    if encrypted:
        assert meta["exc_message"] == ""
        assert event["exception"] == meta["exc_type"]
    else:
        assert meta["exc_message"] == "dependency down (order ***)"
        assert event["exception"] == f"{meta['exc_type']}: dependency down (order ***)"
    assert "'***'" in surfaces["list"]  # the order id, by position
    assert "dependency down (order ***)" in surfaces["show"]
    # The store keeps it whole, for a replay (sealed in Redis with the key, read with it here).
    assert {e.args[0] for e in kept} == set(orders)
    assert {e.exc_message for e in kept} == {f"dependency down (order {o})" for o in orders}


@pytest.mark.parametrize("world", [False], ids=["clear"], indirect=True)
def test_a_task_published_again_shows_its_arguments_as_its_caller_did(
    world: dict[str, str], tmp_path: Path
) -> None:
    """Its retry, and the replay of its entry, carry the caller's ``argsrepr`` and
    ``kwargsrepr``; where Celery made them from the arguments, with the sensitive ones masked."""
    app = make_app(world)
    res = Resilience.for_app(app)
    charge = app.tasks["workerapp.charge"]
    worker = WorkerProcess(world, tmp_path / "worker.log", app="tests.apps.flowerapp")
    hidden, plain = f"order-{uuid.uuid4().hex}", f"order-{uuid.uuid4().hex}"
    try:
        with EventTap(app) as tap:
            worker.start()
            told = charge.apply_async((hidden,), argsrepr="('<an order>',)", kwargsrepr="{}")
            untold = charge.delay(plain)
            wait_for(lambda: res.backout.count() == 2, "both orders parked", 60.0)
            entries = {e.task_id: e for e in res.backout.list()}
            res.runtime.redis.set(f"{world['WORKERAPP_PREFIX']}:dep:up", "1")
            for entry in entries.values():
                res.backout.replay(entry.id)
            wait_for(
                lambda: told.state == untold.state == "SUCCESS", "the replays to succeed", 60.0
            )

            def received(task_id: str) -> list[str]:
                found = tap.of_type("task-received")
                return [e["args"] for e in found if e["uuid"] == task_id]

            wait_for(lambda: len(received(told.id)) == 3, "three deliveries of each", 30.0)
            wait_for(lambda: len(received(untold.id)) == 3, "three deliveries of each", 30.0)
            shown_told, shown_untold = received(told.id), received(untold.id)
    finally:
        worker.stop()
        res.runtime.close()
        app.close()
    # The first, its retry and its replay: as its caller said, each time.
    assert shown_told == ["('<an order>',)"] * 3
    assert entries[told.id].options["argsrepr"] == "('<an order>',)"
    # Celery's own from the arguments: the first as Celery made it, then masked.
    assert shown_untold[0] == repr((plain,))
    assert shown_untold[1:] == ["('***',)"] * 2
