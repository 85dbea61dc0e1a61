"""Workflows (chain, group, chord, link, link_error) whose ``ResilientTask`` members park, in a
real ``celery worker`` (``tests/apps/canvasapp.py``), with the Redis result backend and with
django-celery-results' database backend.

While a member is parked its workflow waits: a chain stops at the parked link, a chord does not
call back. Once the drain replays it, the workflow goes on, as if the member had run late: the
next link runs once with its result, the chord calls back once with every member's result. A
member whose entry dies fails as a Celery task fails: ``link_error`` is called and its chord
fails, instead of waiting forever.

One worker per result backend serves the whole module (the tests run one after the other, each
under tags of its own); the drain runs in the test process.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery, chain, chord, group
from celery.exceptions import ChordError
from celery.result import AsyncResult

from celery_resilience import ParkedTask, Resilience
from celery_resilience.contrib.pytest import delete_prefix
from celery_resilience.drain import DrainReport
from celery_resilience.errors import ParkedTaskDead

from .apps.canvasapp import make_canvas_app
from .support.waiting import wait_for
from .support.worker_process import WorkerProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WAIT = 20.0


class World:
    """The module's worker and app under one key prefix; the dependency is up."""

    def __init__(self, env: dict[str, str], log: Path, redis_url: str) -> None:
        self.prefix = env["WORKERAPP_PREFIX"]
        self.app: Celery = make_canvas_app(env)
        # The drain runs here: a task parked again at its first replay is dead at the next drain.
        self.app.conf.resilience_max_replays = 1
        self.resilience = Resilience.for_app(self.app)
        self.breaker = self.resilience.breaker("dep")
        self.redis = redis.Redis.from_url(redis_url)
        self.redis.set(f"{self.prefix}:dep:up", "1")
        self.worker = WorkerProcess(env, log, app="tests.apps.canvasapp")

    def force_open(self) -> None:
        """Force the breaker open, and wait until the worker heard it: it admits on a closed
        breaker it knows without asking Redis, so a task sent the moment the breaker was forced
        could reach it before the change did."""
        self.breaker.force_open()
        self.wait_worker_knows("forced_open")

    def wait_worker_knows(self, state: str) -> None:
        known = self.task("known")
        wait_for(
            lambda: known.delay("dep").get(timeout=WAIT) == state,
            f"the worker to hear of the breaker {state}",
            WAIT,
        )

    def task(self, name: str) -> Any:
        return self.app.tasks[f"canvas.{name}"]

    def ran(self, task: str, tag: str | None = None) -> list[dict[str, Any]]:
        """What ``canvas.<task>`` recorded, a record per run (with ``tag`` last, if given)."""
        runs = [json.loads(r) for r in self.redis.lrange(f"{self.prefix}:ran", 0, -1)]
        return [
            r
            for r in runs
            if r["task"] == f"canvas.{task}" and (tag is None or r["args"][-1] == tag)
        ]

    def errbacks(self, task_id: str) -> list[dict[str, Any]]:
        found = [json.loads(r) for r in self.redis.lrange(f"{self.prefix}:errbacks", 0, -1)]
        return [f for f in found if f["task_id"] == task_id]

    def entries(self, task_ids: list[str], status: str = "parked") -> dict[str, ParkedTask]:
        entries = self.resilience.backout.list(status=status, limit=10_000)
        return {e.task_id: e for e in entries if e.task_id in task_ids}

    def wait_parked(self, task_ids: list[str], replays: int = 0) -> dict[str, ParkedTask]:
        def parked() -> dict[str, ParkedTask] | None:
            found = self.entries(task_ids)
            ready = len(found) == len(task_ids)
            ready = ready and all(e.replays == replays for e in found.values())
            # A task's entry is stored before its PARKED state is written to the backend.
            ready = ready and all(self.state(task_id) == "PARKED" for task_id in task_ids)
            return found if ready else None

        parked_ = wait_for(parked, f"{task_ids} parked (replays {replays})", WAIT)
        assert isinstance(parked_, dict)
        return parked_

    def state(self, task_id: str) -> str:
        """The task's state in the backend, read without an ``AsyncResult``: one that is
        collected ends the pending wait of its id (its ``__del__``), and on Celery 5.4 a
        group's ``get()`` then waits for ever."""
        return str(self.app.backend.get_task_meta(task_id)["status"])

    def replay_all(self) -> DrainReport:
        """Close the breaker and run a drain (in this process, as beat would in a worker), once
        the worker heard of the reset: a replay reaching a worker that still knows the breaker
        open is parked again (at-least-once holds; the test's one replay would not do)."""
        self.breaker.reset()
        self.wait_worker_knows("closed")
        report = self.resilience.drain()
        assert report.errors == 0, report
        return report

    def drain_until(self, what: str, count: int) -> None:
        """Drain until ``count`` entries were ``what`` (``replayed``, ``dead``)."""
        done = 0

        def enough() -> bool:
            nonlocal done
            done += int(getattr(self.replay_all(), what))
            return done >= count

        wait_for(enough, f"{count} entries {what}", WAIT, poll=0.1)


@pytest.fixture(scope="module", params=["redis", "django"])
def world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, redis_url: str
) -> Iterator[World]:
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    env = {
        "WORKERAPP_PREFIX": prefix,
        "WORKERAPP_QUEUE": f"{prefix}-queue",
        "WORKERAPP_REDIS": redis_url,
        "WORKERAPP_BROKER": redis_url,
    }
    if request.param == "django":
        pytest.importorskip("django_celery_results")
        from django.db import connections

        from .support import django_settings

        django_settings.ensure_test_database("default", request.config)
        database = connections["default"].settings_dict
        fields = ("ENGINE", "NAME", "HOST", "PORT", "USER")
        env["CANVASAPP_DJANGO_DB"] = json.dumps({k: database[k] for k in fields if k in database})
    log = tmp_path_factory.mktemp("canvas") / f"worker-{request.param}.log"
    world = World(env, log, redis_url)
    try:
        world.worker.start()
        # The worker has the same backend: the PARKED states it writes are read here.
        backend = "django_celery_results" if request.param == "django" else "celery.backends.redis"
        assert type(world.app.backend).__module__.startswith(backend)
        yield world
    finally:
        print(f"===== worker log\n{world.worker.stop()}")  # shown when a test failed
        world.resilience.runtime.close()
        world.app.close()
        delete_prefix(world.redis, prefix)
        world.redis.close()


def tag() -> str:
    return uuid.uuid4().hex[:8]


def test_a_chain_stops_at_the_parked_link_and_goes_on_once_it_is_replayed(world: World) -> None:
    double, add, collect = (world.task(name) for name in ("double", "add", "collect"))
    label = tag()
    world.force_open()

    result = chain(double.s(1), add.s(2), collect.s(label)).apply_async()
    parked_link, head = result.parent, result.parent.parent
    entry = world.wait_parked([parked_link.id])[parked_link.id]

    # Parked with the rest of the chain: the link before it ran, nothing after it.
    assert entry.reason == "breaker_open"
    assert entry.args == [2, 2]
    assert [link["task"] for link in entry.options["chain"]] == ["canvas.collect"]
    assert (entry.options["root_id"], entry.options["parent_id"]) == (head.id, head.id)
    assert (head.state, parked_link.state, result.state) == ("SUCCESS", "PARKED", "PENDING")
    assert world.ran("collect", label) == []

    world.replay_all()
    assert result.get(timeout=WAIT) == 4
    [replayed] = [r for r in world.ran("add") if r["id"] == parked_link.id]
    assert (replayed["parent_id"], replayed["root_id"]) == (head.id, head.id)
    [link] = world.ran("collect", label)
    assert (link["args"], link["parent_id"], link["root_id"]) == (
        [4, label],
        parked_link.id,
        head.id,
    )


def test_a_chord_waits_for_its_parked_members_then_calls_back_once_with_every_result(
    world: World,
) -> None:
    add, double, collect, label = (
        world.task("add"),
        world.task("double"),
        world.task("collect"),
        tag(),
    )
    world.force_open()

    # The breaker's members park, the others run at once.
    header = [add.s(0, 0), double.s(1), add.s(2, 2), double.s(3)]
    result = chord(header, collect.s(label)).apply_async()
    members = [r.id for r in result.parent.results]
    parked = world.wait_parked([members[0], members[2]])
    wait_for(
        lambda: world.state(members[1]) == world.state(members[3]) == "SUCCESS",
        "the members without a breaker to succeed",
    )

    group_id = result.parent.id
    for index in (0, 2):
        options = parked[members[index]].options
        assert (options["group_id"], options["group_index"]) == (group_id, index)
        assert options["chord"]["task"] == "canvas.collect"
    assert world.state(members[0]) == "PARKED"
    assert world.ran("collect", label) == []  # the chord waits

    world.replay_all()
    assert result.get(timeout=WAIT) == [0, 2, 4, 6]
    time.sleep(0.3)  # a second callback, if any, would come now
    [callback] = world.ran("collect", label)
    assert callback["args"] == [[0, 2, 4, 6], label]
    ids = [r["id"] for r in world.ran("add")]
    assert (ids.count(members[0]), ids.count(members[2])) == (1, 1)


def test_a_group_is_ready_once_its_parked_members_are_replayed(world: World) -> None:
    add = world.task("add")
    world.force_open()

    result = group(add.s(i, i) for i in range(3)).apply_async()
    members = [r.id for r in result.results]
    parked = world.wait_parked(members)
    assert {e.options["group_id"] for e in parked.values()} == {result.id}
    assert not result.ready()

    world.replay_all()
    assert result.get(timeout=WAIT) == [0, 2, 4]


def test_link_and_link_error_are_kept_on_the_replayed_message(world: World) -> None:
    add, collect, errback, label = (
        world.task("add"),
        world.task("collect"),
        world.task("errback"),
        tag(),
    )
    world.force_open()

    # A header of the app's own is kept; the broker's mark of a redelivery is not: the replay
    # is a new message.
    headers = {"tenant": "acme", "redelivered": True}
    result = add.apply_async((2, 3), link=collect.s(label), link_error=errback.s(), headers=headers)
    entry = world.wait_parked([result.id])[result.id]
    assert [s["task"] for s in entry.options["link"]] == ["canvas.collect"]
    assert [s["task"] for s in entry.options["link_error"]] == ["canvas.errback"]
    assert entry.options["headers"] == {"tenant": "acme"}

    world.replay_all()
    assert result.get(timeout=WAIT) == 5
    [linked] = wait_for(lambda: world.ran("collect", label), "the link to run")
    assert (linked["args"], linked["parent_id"]) == ([5, label], result.id)
    assert world.errbacks(result.id) == []


def test_a_member_that_dies_calls_its_link_error_and_fails_its_chord_and_chain(
    world: World,
) -> None:
    add, later, collect, errback = (
        world.task(name) for name in ("add", "later", "collect", "errback")
    )
    in_chord, in_chain = tag(), tag()
    # ``later`` parks at every delivery; the drain allows one replay (resilience_max_replays).
    header = [add.s(1, 1), later.s(7).on_error(errback.s()), add.s(3, 3)]
    chorded = chord(header, collect.s(in_chord).on_error(errback.s())).apply_async()
    chained = chain(later.s(8), collect.s(in_chain)).apply_async()
    dying = [chorded.parent.results[1].id, chained.parent.id]

    world.wait_parked(dying)
    # Each is replayed once (due a moment after it parked: park_on), parked again by its
    # replay, then dead at the next claim: the same drain may do all three on a slow host.
    world.drain_until("dead", 2)

    dead = world.entries(dying, status="dead")
    assert {e.dead_reason for e in dead.values()} == {"max_replays"}
    assert {e.replays for e in dead.values()} == {1}
    # The member fails as a Celery task fails: its result, its errback, its chord.
    member = AsyncResult(dying[0], app=world.app)
    assert member.state == "FAILURE"
    assert isinstance(member.result, ParkedTaskDead)
    assert "max_replays" in str(member.result)
    [called] = world.errbacks(dying[0])
    assert called["exc_type"] == "ParkedTaskDead"
    with pytest.raises(ParkedTaskDead, match=dying[0]):  # get() raises the header's error
        chorded.get(timeout=WAIT)
    assert chorded.state == "FAILURE"
    assert isinstance(chorded.result, ChordError)
    assert dying[0] in str(chorded.result)
    assert [f["exc_type"] for f in world.errbacks(chorded.id)] == ["ChordError"]
    # The chain's last result fails too, rather than stay pending.
    with pytest.raises(ParkedTaskDead):
        chained.get(timeout=WAIT)
    assert world.ran("collect", in_chord) == world.ran("collect", in_chain) == []


def test_a_parked_task_that_expired_fails_with_its_link_error_when_a_person_replays_it(
    world: World,
) -> None:
    add, errback = world.task("add"), world.task("errback")
    world.force_open()

    # Long enough for a busy worker to park it first (Celery revokes an expired message before
    # the task sees it); the replay comes after it.
    result = add.apply_async((4, 5), expires=3.0, link_error=errback.s())
    expires = time.time() + 3.0  # no earlier than Celery's own deadline
    entry = world.wait_parked([result.id])[result.id]
    time.sleep(max(0.0, expires - time.time()) + 0.1)
    with pytest.raises(ValueError, match="expired"):
        world.resilience.replay(entry.id)

    assert getattr(world.resilience.backout.get(entry.id), "dead_reason", None) == "expired"
    assert result.state == "FAILURE"
    assert isinstance(result.result, ParkedTaskDead)
    assert [f["exc_type"] for f in world.errbacks(result.id)] == ["ParkedTaskDead"]
