"""What a drain batch costs does not grow with the entries in it, and an error in the middle of
a batch gives back at once what it did not publish.

Real Redis (broker and store), a queue of the test's own."""

from __future__ import annotations

from typing import Any

import pytest
import redis
import redis.connection
from kombu.entity import Queue

from celery_resilience.drain import Drainer, batch
from tests.support.drain_world import drain_setup, park, sent_ids
from tests.support.kombu_features import publishes_in_batches
from tests.support.resilience import AppSetup, MakeResilience

pytestmark = pytest.mark.integration


@pytest.fixture
def app_setup(queue: str) -> AppSetup:
    return drain_setup(queue)


class Counted:
    """Counts calls of ``owner.name`` while the test runs."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> None:
        self.calls = 0
        original = getattr(owner, name)

        def counting(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, counting)


@pytest.fixture
def round_trips(monkeypatch: pytest.MonkeyPatch) -> Counted:
    """Every command or pipeline a redis-py connection sends (the store's and the broker's)."""
    return Counted(monkeypatch, redis.connection.AbstractConnection, "send_packed_command")


def test_a_batch_binds_its_replay_queue_once_not_once_per_entry(
    make_resilience: MakeResilience,
    queue: str,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    resilience = make_resilience(drain_batch=50)
    entries = park(resilience, 40, queue)
    binds = Counted(monkeypatch, Queue, "bind")
    report = resilience.drain()
    assert report.replayed == 40
    assert sorted(sent_ids(redis_client, queue)) == sorted(e.task_id for e in entries)
    assert binds.calls <= 1  # kombu bound a fresh copy of the queue for every message before


def test_round_trips_of_a_drain_do_not_grow_with_the_entries_of_a_batch(
    make_resilience: MakeResilience,
    queue: str,
    round_trips: Counted,
) -> None:
    resilience = make_resilience(drain_batch=100)
    park(resilience, 3, queue, tag="warm")
    assert resilience.drain().replayed == 3  # connections made, scripts loaded
    counts = []
    for size in (5, 100):
        park(resilience, size, queue, tag=f"n{size}")
        before = round_trips.calls
        assert resilience.drain().replayed == size
        counts.append(round_trips.calls - before)
    # The same few round trips a drain, and the messages themselves: kombu before 5.7 publishes
    # them one by one, a round trip each. Any other cost per entry would add 95 more; a few may
    # fall due with time alone (a health check PING, a refresh of what the process knows) in
    # the longer drain of a loaded host.
    per_message = 0 if publishes_in_batches(resilience) else 1
    assert abs(counts[1] - counts[0] - per_message * 95) <= 15, counts


def test_an_error_before_the_publish_gives_the_batch_back_at_once(
    make_resilience: MakeResilience,
    queue: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    resilience = make_resilience(drain_batch=20)
    park(resilience, 10, queue)
    original = batch.drain_refusal  # type: ignore[attr-defined]  # the drain's, replaced
    seen: list[str] = []

    def failing(runtime: Any, name: str, entry: Any, now: float) -> Any:
        seen.append(entry.id)
        if len(seen) == 4:
            raise RuntimeError("a check that broke")
        return original(runtime, name, entry, now)

    monkeypatch.setattr(batch, "drain_refusal", failing)
    with pytest.raises(RuntimeError):
        resilience.drain()
    # Due again now, not when the claims' lease ends (a minute later).
    assert resilience.runtime.backout_store.due("dep") == 10
    monkeypatch.setattr(batch, "drain_refusal", original)
    assert resilience.drain().replayed == 10


def test_drainer_step_is_a_deprecated_name_of_a_pass(
    make_resilience: MakeResilience,
    queue: str,
) -> None:
    resilience = make_resilience(drain_slow_start=100)
    park(resilience, 3, queue, breaker=None)
    with pytest.warns(DeprecationWarning, match="drain_once"):
        report = Drainer(resilience.runtime).step()
    assert report.replayed == 3
