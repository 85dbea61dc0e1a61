"""The drain's world without a worker: an app's own queue in the Redis broker, its task, entries
parked straight into the store, and what a drain published read back from the broker (kombu keeps
a queue as a Redis list named after it, one more list per priority step).

``queue`` is a fixture of the whole suite (``conftest.py`` loads this module as a plugin). A test
module whose apps live in this world overrides ``app_setup`` with ``drain_setup(queue)``:
``make_resilience`` then makes apps that publish to the test's queue and know ``TASK``.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from celery import Celery

from celery_resilience import ParkedTask, Resilience
from celery_resilience.drain import replay, sending
from celery_resilience.runtime import Runtime

from .resilience import AppSetup

TASK = "t.charge"


def charge(order: int, note: str | None = None) -> int:
    return order


# -- reading what the drain published ------------------------------------------------------


@dataclass(frozen=True)
class Sent:
    """One task message found in the broker."""

    task_id: str
    task: str
    replays: int | None
    args: list[Any]
    kwargs: dict[str, Any]
    priority: int | None
    headers: dict[str, Any]


def queue_keys(client: redis.Redis, queue: str) -> list[bytes]:
    """The queue's list and its priority lists (``<queue>\\x06\\x16<step>``)."""
    return [queue.encode(), *client.scan_iter(match=f"{queue}\x06\x16*")]


def sent(client: redis.Redis, queue: str) -> list[Sent]:
    """Every message waiting in ``queue``, oldest first within each priority list."""
    found = []
    for key in queue_keys(client, queue):
        for raw in reversed(client.lrange(key, 0, -1)):
            message = json.loads(raw)
            headers = message["headers"]
            assert message["properties"]["body_encoding"] == "base64"
            args, kwargs, _embed = json.loads(base64.b64decode(message["body"]))
            found.append(
                Sent(
                    task_id=headers["id"],
                    task=headers["task"],
                    replays=headers.get("resilience_replays"),
                    args=args,
                    kwargs=kwargs,
                    priority=message["properties"].get("priority"),
                    headers=headers,
                )
            )
    return found


def sent_ids(client: redis.Redis, queue: str) -> list[str]:
    return [s.task_id for s in sent(client, queue)]


def sent_count(client: redis.Redis, queue: str) -> int:
    return sum(client.llen(key) for key in queue_keys(client, queue))


# -- apps, stores, entries -----------------------------------------------------------------


@pytest.fixture
def queue(redis_client: redis.Redis) -> Iterator[str]:
    """A queue of this test's own in the broker database; emptied and unbound afterwards."""
    name = f"drain-test-{uuid.uuid4().hex[:12]}"
    yield name
    keys = [*queue_keys(redis_client, name), f"_kombu.binding.{name}".encode()]
    redis_client.delete(*keys)


def drain_setup(queue: str) -> AppSetup:
    """Each app publishes to ``queue``, knows ``TASK``, and drains unpaced (pacing only where a
    test asks for it)."""

    def setup(app: Celery) -> None:
        app.conf.task_default_queue = queue
        app.conf.resilience_drain_rate = 100_000.0
        app.task(name=TASK, shared=False)(charge)

    return setup


def park(
    resilience: Resilience,
    count: int,
    queue: str,
    *,
    breaker: str | None = "dep",
    due_in: float = 0.0,
    tag: str = "t",
    **fields: Any,
) -> list[ParkedTask]:
    """``count`` entries of ``TASK``, due ``due_in`` seconds from now, oldest first."""
    now = time.time()
    entries = []
    for i in range(count):
        values: dict[str, Any] = {
            "task_name": TASK,
            "task_id": f"{tag}-{i}-{uuid.uuid4().hex[:8]}",
            "reason": "breaker_open",
            "breaker": breaker,
            "args": [i],
            "options": {"queue": queue},
            "parked_at": now - 60 + i * 1e-3,
            "due_at": now - 60 + i * 1e-3 if due_in <= 0 else now + due_in,
        }
        values.update(fields)
        entry = ParkedTask.new(**values)
        resilience.runtime.backout_store.park(entry)
        entries.append(entry)
    return entries


class PublishSpy:
    """Wraps ``publish`` (the drain's and a replay's): records each publish; ``hook(n, entry)``
    runs before the n-th+1."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        hook: Callable[[int, ParkedTask], None] | None = None,
    ) -> None:
        self.task_ids: list[str] = []
        self.times: list[float] = []
        self._lock = threading.Lock()
        original = sending.publish  # type: ignore[attr-defined]  # the drain's, spied on

        def spy(runtime: Runtime, entry: ParkedTask, producer: Any = None) -> None:
            if hook is not None:
                hook(len(self.task_ids), entry)
            original(runtime, entry, producer)
            with self._lock:
                self.task_ids.append(entry.task_id)
                self.times.append(time.monotonic())

        monkeypatch.setattr(sending, "publish", spy)
        monkeypatch.setattr(replay, "publish", spy)
