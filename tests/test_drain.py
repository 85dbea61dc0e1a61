"""The drain brings parked tasks back: original ids and options, gated by the breaker, paced.

No worker runs here: entries are parked straight into the store, a drain runs in the test, and
what it published is read back from the Redis broker (kombu keeps a queue as a Redis list named
after it, one more list per priority step). Each test uses its own queue and key prefix.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

from celery_resilience import ParkedTask, Resilience
from celery_resilience.backout import Filter, RedisBackoutStore
from celery_resilience.drain import Drainer, DrainReport, drainer, replay
from celery_resilience.drain.batch import PUBLISH_RETRY_DELAY
from celery_resilience.drain.lock import drain_lock
from celery_resilience.errors import DrainBusy, EntryNotFound, NotReplayable, ResilienceError
from tests.support.drain_world import (
    TASK,
    PublishSpy,
    drain_setup,
    park,
    sent,
    sent_count,
    sent_ids,
)
from tests.support.raw_entries import put_raw
from tests.support.resilience import AppSetup, MakeResilience
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

KINDS = ["redis", "memory"]


@pytest.fixture
def app_setup(queue: str) -> AppSetup:
    return drain_setup(queue)


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# -- what a drain publishes ------------------------------------------------------------------


def test_drain_publishes_due_entries_with_their_ids_args_and_options(
    kind: str, make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    resilience = make_resilience(kind)
    due = [
        *park(resilience, 3, queue, kwargs={"note": "a"}, options={"queue": queue}),
        *park(resilience, 2, queue, tag="pri", replays=2, options={"queue": queue, "priority": 6}),
        *park(
            resilience,
            1,
            queue,
            tag="hdr",
            options={"queue": queue, "headers": {"x-trace": "abc"}},
        ),
    ]
    later = park(resilience, 2, queue, tag="later", due_in=3600.0)

    report = resilience.drain()

    assert (report.replayed, report.dead, report.errors, report.locked) == (6, 0, 0, False)
    messages = {s.task_id: s for s in sent(redis_client, queue)}
    assert set(messages) == {e.task_id for e in due}
    for entry in due:
        message = messages[entry.task_id]
        assert message.task == TASK
        assert message.args == entry.args
        assert message.kwargs == entry.kwargs
        assert message.replays == entry.replays + 1
        assert message.priority == entry.options.get("priority", 0)
    hdr = next(e for e in due if e.task_id.startswith("hdr"))
    assert messages[hdr.task_id].headers["x-trace"] == "abc"
    store = resilience.runtime.backout_store
    assert store.count() == 2
    assert {e.id for e in store.list()} == {e.id for e in later}
    assert all(store.get(e.id) is None for e in due)
    assert store.in_flight() == 0


def test_drain_of_an_empty_store_does_nothing(
    kind: str, make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    report = make_resilience(kind).drain()
    assert report == DrainReport(duration=report.duration)
    assert sent_count(redis_client, queue) == 0


def test_limit_caps_the_number_replayed(
    kind: str, make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    resilience = make_resilience(kind, drain_batch=4)
    park(resilience, 10, queue)

    report = resilience.drain(limit=7)

    assert report.replayed == 7
    assert sent_count(redis_client, queue) == 7
    assert resilience.backout.count() == 3
    assert report.skipped == 3


# -- gating by the breaker -------------------------------------------------------------------


@pytest.mark.parametrize("how", ["forced", "tripped"])
def test_open_breaker_replays_nothing(
    kind: str, how: str, make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    resilience = make_resilience(
        kind, breakers={"dep": {"failure_threshold": 1, "open_timeout": 300.0}}
    )
    breaker = resilience.breaker("dep")
    if how == "forced":
        breaker.force_open()
    else:
        breaker.acquire().failure()
    assert breaker.state == ("forced_open" if how == "forced" else "open")
    park(resilience, 10, queue)

    report = resilience.drain()

    assert (report.replayed, report.skipped) == (0, 10)
    assert report.breakers["dep"]["skipped"] == 10
    assert sent_count(redis_client, queue) == 0
    assert resilience.backout.count(breaker="dep", status="parked") == 10
    assert resilience.runtime.backout_store.in_flight() == 0


def test_half_open_breaker_replays_only_its_probe_permits(
    kind: str, make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    resilience = make_resilience(
        kind,
        breakers={"dep": {"failure_threshold": 1, "open_timeout": 0.2, "half_open_max_calls": 2}},
    )
    breaker = resilience.breaker("dep")
    breaker.acquire().failure()
    assert breaker.snapshot()["opened_total"] == 1  # (its 0.2 s may be over already: no state)
    park(resilience, 10, queue)
    wait_for(lambda: breaker.state == "half_open", "the breaker half-open")

    report = resilience.drain()

    assert (report.replayed, report.skipped) == (2, 8)
    assert sent_count(redis_client, queue) == 2
    assert resilience.backout.count() == 8


def test_a_full_bulkhead_replays_nothing_and_a_free_slot_replays_everything(
    kind: str, make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    resilience = make_resilience(kind, breakers={"dep": {"max_concurrent_calls": 1}})
    breaker = resilience.breaker("dep")
    held = breaker.acquire()  # the one slot: a call in flight, the dependency busy
    park(resilience, 5, queue)

    report = resilience.drain()
    assert (report.replayed, report.skipped) == (0, 5)
    assert sent_count(redis_client, queue) == 0

    held.success()
    report = resilience.drain()
    assert report.replayed == 5  # the bulkhead limits calls at once, not the drain's pace
    assert sent_count(redis_client, queue) == 5


def test_replays_spend_the_retry_budget_and_what_it_refuses_stays_parked(
    kind: str, make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    # a budget of no share and 0.1 retries a second over 60 s: 6 replays in the window
    budget = {"retry_budget": 0.0, "min_retries_per_second": 0.1, "window": 60.0}
    resilience = make_resilience(kind, drain_batch=2, breakers={"dep": budget})
    park(resilience, 10, queue, reason="retry_budget")

    report = resilience.drain()
    assert report.replayed == 6
    assert sent_count(redis_client, queue) == 6
    assert resilience.backout.count(status="parked") == 4
    # the first batch refused stops the drain: the last one is not claimed, paced and refused
    assert report.skipped == 2
    # the rest is due again later, not at once: a second drain now sends nothing
    assert resilience.drain().replayed == 0
    snap = resilience.breaker("dep").snapshot()
    assert (snap["window_retries"], snap["retry_budget_refused_total"]) == (6, 4)


def test_closed_breaker_drains_everything_in_batches_at_the_rate(
    kind: str,
    make_resilience: MakeResilience,
    redis_client: redis.Redis,
    queue: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given 300 entries, batches of 100 and 200 tasks/s: the first batch goes at once (a full
    # bucket), each later one waits for 100 tokens, 0.5 s.
    resilience = make_resilience(kind, drain_batch=100, drain_rate=200.0)
    park(resilience, 300, queue)
    store = resilience.runtime.backout_store
    claims: list[int] = []
    claiming_at: list[float] = []
    claim = store.claim

    def counting_claim(*args: Any, **kwargs: Any) -> list[ParkedTask]:
        claiming_at.append(time.monotonic())
        claimed = claim(*args, **kwargs)
        claims.append(len(claimed))
        return claimed

    monkeypatch.setattr(store, "claim", counting_claim)
    spy = PublishSpy(monkeypatch)

    report = resilience.drain()

    assert report.replayed == 300
    assert sorted(sent_ids(redis_client, queue)) == sorted(spy.task_ids)
    assert len(set(spy.task_ids)) == 300
    assert [n for n in claims if n] == [100, 100, 100]
    # The pace counts from the first batch's tokens, taken just before its claim (its first
    # publish may come many milliseconds later on a loaded host).
    first = claiming_at[0]
    assert spy.times[100] - first >= 0.45
    assert spy.times[200] - first >= 0.95
    assert report.duration >= 0.95
    assert store.count() == 0


def test_breaker_reopening_mid_drain_stops_it_within_one_batch(
    kind: str,
    make_resilience: MakeResilience,
    redis_client: redis.Redis,
    queue: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    resilience = make_resilience(kind, drain_batch=10)
    park(resilience, 100, queue)
    breaker = resilience.breaker("dep")

    def reopen(published: int, entry: ParkedTask) -> None:
        if published == 15:  # half-way through the second batch
            breaker.force_open()

    spy = PublishSpy(monkeypatch, reopen)

    report = resilience.drain()

    assert 15 <= len(spy.task_ids) <= 20
    assert report.replayed == len(spy.task_ids) == sent_count(redis_client, queue)
    assert resilience.backout.count() == 100 - report.replayed
    assert report.skipped == 100 - report.replayed
    assert resilience.runtime.backout_store.in_flight() == 0


def test_entries_without_a_breaker_drain_without_gating(
    kind: str, make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    resilience = make_resilience(kind)
    resilience.breaker("dep").force_open()
    free = park(resilience, 5, queue, breaker=None, tag="free")
    held = park(resilience, 3, queue, tag="held")

    report = resilience.drain()

    assert (report.replayed, report.skipped) == (5, 3)
    assert sorted(sent_ids(redis_client, queue)) == sorted(e.task_id for e in free)
    assert {e.id for e in resilience.backout.list()} == {e.id for e in held}


def test_draining_one_breaker_leaves_the_others(
    kind: str, make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    resilience = make_resilience(kind)
    mine = park(resilience, 4, queue, breaker="dep")
    other = park(resilience, 3, queue, breaker="other", tag="other")
    free = park(resilience, 2, queue, breaker=None, tag="free")

    assert resilience.drain(breaker="dep").replayed == 4
    assert resilience.drain(breaker="-").replayed == 2

    assert sorted(sent_ids(redis_client, queue)) == sorted(e.task_id for e in mine + free)
    assert {e.id for e in resilience.backout.list()} == {e.id for e in other}


# -- entries that can't be replayed ------------------------------------------------------------


def test_bad_entries_end_dead_and_never_stop_the_drain(
    kind: str, make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    resilience = make_resilience(kind, max_replays=3, drain_batch=4)
    store = resilience.runtime.backout_store
    put_raw(store, "corrupt", b"garbage", breaker="dep", parked_at=time.time() - 120)
    (gone,) = park(resilience, 1, queue, task_name="t.gone", tag="gone")
    (worn,) = park(resilience, 1, queue, replays=3, tag="worn")
    (young,) = park(resilience, 1, queue, replays=2, tag="young")
    good = park(resilience, 5, queue, tag="good")

    report = resilience.drain()

    # A task this process lacks is no bad entry: it goes out by name, for a worker that has it.
    assert (report.replayed, report.dead, report.errors) == (7, 2, 0)
    published = {s.task_id: s for s in sent(redis_client, queue)}
    assert set(published) == {e.task_id for e in [gone, young, *good]}
    assert published[young.task_id].replays == 3
    dead = {e.id: e.dead_reason for e in resilience.backout.list(status="dead")}
    assert dead == {"corrupt": "undecodable", worn.id: "max_replays"}
    assert resilience.backout.count(status="parked") == 0
    assert resilience.backout.count(status="dead") == 2

    again = resilience.drain()
    assert (again.replayed, again.dead, again.skipped) == (0, 0, 0)
    assert resilience.backout.count(status="dead") == 2


def test_entry_with_unreadable_metadata_never_stops_the_drain(
    make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    # E.g. a reason added by a newer release, read by an older drainer during a rolling deploy.
    resilience = make_resilience("redis")
    store = resilience.runtime.backout_store
    assert isinstance(store, RedisBackoutStore)
    odd, *good = park(resilience, 3, queue)
    store.client.hset(store.keys.meta, odd.id, "parked|from_the_future||dep")

    report = resilience.drain()

    assert (report.replayed, report.dead, report.held) == (2, 0, 1)
    assert sorted(sent_ids(redis_client, queue)) == sorted(e.task_id for e in good)
    kept = resilience.backout.get(odd.id)  # held for a release that reads it, never killed
    assert kept is not None
    assert kept.status == "parked"
    assert kept.held == "its status or reason (parked, from_the_future) is unknown to this release"


def test_entry_whose_args_no_longer_fit_the_task_ends_dead(
    kind: str, make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    # Celery checks args against the signature before publishing: that entry can never be
    # published, so it must not hold back the ones behind it on every drain.
    resilience = make_resilience(kind, drain_batch=3)
    before = park(resilience, 2, queue, tag="before")
    (misfit,) = park(resilience, 1, queue, kwargs={"no_such_arg": 1}, tag="misfit")
    after = park(resilience, 4, queue, tag="after")

    report = resilience.drain()

    assert (report.replayed, report.dead, report.errors) == (6, 1, 0)
    assert sorted(sent_ids(redis_client, queue)) == sorted(e.task_id for e in before + after)
    kept = resilience.backout.get(misfit.id)
    assert kept is not None
    assert kept.status == "dead"
    assert kept.dead_reason


def test_publish_refused_by_the_broker_leaves_the_rest_parked(
    kind: str,
    make_resilience: MakeResilience,
    redis_client: redis.Redis,
    queue: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    resilience = make_resilience(kind)
    entries = park(resilience, 10, queue)

    def refuse_third(published: int, entry: ParkedTask) -> None:
        if published == 2:
            raise ConnectionRefusedError("broker down")

    spy = PublishSpy(monkeypatch, refuse_third)

    report = resilience.drain()

    assert (report.replayed, report.errors) == (2, 1)
    assert sent_ids(redis_client, queue) == spy.task_ids == [e.task_id for e in entries[:2]]
    store = resilience.runtime.backout_store
    assert store.count(Filter(status="parked")) == 8
    assert {e.id for e in store.list()} == {e.id for e in entries[2:]}
    assert store.in_flight() == 0
    # Given back, due again a little later: an immediate drain does not hammer the broker.
    now = resilience.runtime.now()
    assert store.due("dep", now=now) == 0
    assert store.due("dep", now=now + PUBLISH_RETRY_DELAY + 1) == 8


# -- replay by hand ----------------------------------------------------------------------------


def test_replay_publishes_now_whatever_the_breaker_says(
    kind: str, make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    resilience = make_resilience(kind)
    resilience.breaker("dep").force_open()
    entry, other = park(resilience, 2, queue, replays=1, due_in=3600.0)

    replayed = resilience.backout.replay(entry.id)

    assert replayed == entry
    (message,) = sent(redis_client, queue)
    assert (message.task_id, message.args, message.replays) == (entry.task_id, entry.args, 2)
    assert resilience.backout.get(entry.id) is None
    assert resilience.backout.get(other.id) == other
    with pytest.raises(EntryNotFound) as gone:
        resilience.backout.replay(entry.id)
    assert isinstance(gone.value, KeyError)  # what callers caught before it had a name
    with pytest.raises(KeyError):
        resilience.backout.replay("no-such-entry")


def test_replay_of_a_task_this_process_lacks_publishes_it_by_name(
    kind: str, make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    resilience = make_resilience(kind)
    (entry,) = park(resilience, 1, queue, task_name="t.gone")

    resilience.backout.replay(entry.id)

    assert resilience.backout.get(entry.id) is None
    assert [(s.task_id, s.task) for s in sent(redis_client, queue)] == [(entry.task_id, "t.gone")]


def test_replay_of_an_expired_entry_refuses_and_marks_it_dead(
    kind: str, make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    resilience = make_resilience(kind)
    gone = "2020-01-01T00:00:00+00:00"
    (entry,) = park(resilience, 1, queue, options={"queue": queue, "expires": gone})

    with pytest.raises(NotReplayable, match="expired at 2020-01-01T00:00:00") as refused:
        resilience.backout.replay(entry.id)
    assert isinstance(refused.value, ValueError)

    kept = resilience.backout.get(entry.id)
    assert kept is not None
    assert (kept.status, kept.dead_reason) == ("dead", "expired")
    assert sent_count(redis_client, queue) == 0


def test_a_person_may_replay_a_dead_entry_but_not_one_that_cannot_be_read(
    kind: str, make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    resilience = make_resilience(kind)
    store = resilience.runtime.backout_store
    spent, unreadable = park(resilience, 2, queue)
    assert store.mark_dead(spent.id, "max_replays")
    # Bytes that decode to nothing: the entry is kept, dead "undecodable", whatever a person does.
    put_raw(store, unreadable.id, b"\xff not an entry")

    replayed = resilience.backout.replay(spent.id)  # its cause is gone: a person decided

    (message,) = sent(redis_client, queue)
    assert (message.task_id, replayed.task_id) == (spent.task_id, spent.task_id)
    assert resilience.backout.get(spent.id) is None
    with pytest.raises(ValueError, match=r"undecodable|can't be decoded"):
        resilience.backout.replay(unreadable.id)
    assert resilience.backout.get(unreadable.id) is not None
    assert sent_count(redis_client, queue) == 1


# -- one drainer at a time -----------------------------------------------------------------------


def race(first: Resilience, second: Resilience) -> list[list[DrainReport]]:
    """Two drainers started together, each draining until the store is empty (10 s at most):
    the reports of each."""
    reports: list[list[DrainReport]] = [[], []]
    stop = time.monotonic() + 10.0
    start = threading.Barrier(2)

    def run(resilience: Resilience, mine: list[DrainReport]) -> None:
        start.wait()
        _drain_until_empty(resilience, mine, stop)

    threads = [
        threading.Thread(target=run, args=(r, mine))
        for r, mine in zip((first, second), reports, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return reports


def _drain_until_empty(resilience: Resilience, reports: list[DrainReport], stop: float) -> None:
    while resilience.runtime.backout_store.count() and time.monotonic() < stop:
        report = Drainer(resilience.runtime).run()
        reports.append(report)
        if report.locked:
            time.sleep(0.005)


def test_two_drains_at_once_never_publish_an_entry_twice(
    kind: str,
    make_resilience: MakeResilience,
    redis_client: redis.Redis,
    queue: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = make_resilience(kind, drain_batch=20)
    second = make_resilience(kind, like=first, drain_batch=20)
    entries = park(first, 150, queue)
    spy = PublishSpy(monkeypatch, lambda n, entry: time.sleep(0.001))
    reports = race(first, second)

    ledger = sent_ids(redis_client, queue)
    assert len(ledger) == len(set(ledger)) == 150
    assert sorted(spy.task_ids) == sorted(ledger) == sorted(e.task_id for e in entries)
    every = reports[0] + reports[1]
    assert any(r.locked for r in every)
    assert all(r.replayed == 0 for r in every if r.locked)
    assert sum(r.replayed for r in every) == 150
    assert first.backout.count() == 0


def test_claims_are_exclusive_even_without_the_drain_lock(
    kind: str,
    make_resilience: MakeResilience,
    redis_client: redis.Redis,
    queue: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The lease alone keeps two drainers apart (the lock only keeps them from both trying).
    first = make_resilience(kind, drain_batch=10)
    second = make_resilience(kind, like=first, drain_batch=10)
    park(first, 150, queue)
    monkeypatch.setattr(drainer, "drain_lock", _no_lock)
    PublishSpy(monkeypatch, lambda n, entry: time.sleep(0.001))
    reports = race(first, second)

    ledger = sent_ids(redis_client, queue)
    assert len(ledger) == len(set(ledger)) == 150
    assert all(sum(r.replayed for r in mine) > 0 for mine in reports)  # both really drained


class _no_lock:  # stands in for the ``drain_lock`` context manager
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> object:
        return object()

    def __exit__(self, *exc: object) -> None:
        return None


def test_replay_waits_for_a_running_drain(
    make_resilience: MakeResilience,
    redis_client: redis.Redis,
    queue: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    resilience = make_resilience("redis", drain_batch=5)
    entries = park(resilience, 20, queue)
    started = threading.Event()

    def slow(published: int, entry: ParkedTask) -> None:
        started.set()
        time.sleep(0.01)

    PublishSpy(monkeypatch, slow)
    runner = threading.Thread(target=resilience.drain)
    runner.start()
    assert started.wait(5.0)
    # The last entry is still parked or claimed by the drain: replay waits, then finds it gone.
    with pytest.raises(KeyError):
        resilience.backout.replay(entries[-1].id)
    runner.join()
    ledger = sent_ids(redis_client, queue)
    assert len(ledger) == len(set(ledger)) == 20


def test_replay_gives_up_with_drain_busy_while_a_drain_keeps_the_lock(
    kind: str,
    make_resilience: MakeResilience,
    redis_client: redis.Redis,
    queue: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a drain that holds the lock longer than a replay waits for it
    resilience = make_resilience(kind)
    (entry,) = park(resilience, 1, queue)
    monkeypatch.setattr(replay, "REPLAY_WAIT", 0.2)
    with drain_lock(resilience.runtime, 30.0) as held:
        assert held is not None
        # When a person replays an entry meanwhile
        with pytest.raises(DrainBusy, match="a drain holds the lock") as busy:
            resilience.backout.replay(entry.id)
    # Then the error is the package's and still the TimeoutError callers caught; nothing moved
    assert isinstance(busy.value, TimeoutError)
    assert isinstance(busy.value, ResilienceError)
    assert resilience.backout.get(entry.id) == entry
    assert sent_count(redis_client, queue) == 0
    resilience.backout.replay(entry.id)  # the lock given up: the replay goes through
    assert sent_count(redis_client, queue) == 1


def test_pacing_longer_than_the_lease_neither_duplicates_nor_crashes(
    make_resilience: MakeResilience,
    redis_client: redis.Redis,
    queue: str,
) -> None:
    # Given batches of 5 at 2.5 tasks/s, a batch waits 2 s for its tokens: twice the lease. The
    # wait must not eat the lease of claimed entries, nor let the drain lock expire so that a
    # second drainer claims them again (a plausible setup: a fragile dependency at 1 task/s
    # with the default batch of 100 and lease of 60 s).
    first = make_resilience("redis", drain_batch=5, drain_rate=2.5)
    second = make_resilience("redis", drain_batch=5, drain_rate=2.5)
    park(first, 15, queue)
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["report"] = Drainer(first.runtime, lease=1.0).run()
        except Exception as exc:
            outcome["error"] = exc

    runner = threading.Thread(target=run)
    runner.start()
    wait_for(  # the first drainer holds the lock (its first batch went out; 4 s to go)
        lambda: sent_count(redis_client, queue) > 0 or not runner.is_alive(),
        "the first drainer to publish",
    )
    late: list[DrainReport] = []
    while runner.is_alive():  # a second drainer keeps trying while the first one waits
        late.append(Drainer(second.runtime, lease=1.0).run())
        time.sleep(0.05)
    runner.join()

    assert "error" not in outcome, outcome.get("error")
    assert outcome["report"].replayed == 15
    assert any(r.locked for r in late)
    assert all(r.replayed == 0 for r in late)
    ledger = sent_ids(redis_client, queue)
    assert len(ledger) == len(set(ledger)) == 15
    assert first.backout.count() == 0


# -- the drain task ------------------------------------------------------------------------------


def test_drain_task_is_registered_and_scheduled_by_beat(
    make_resilience: MakeResilience, redis_client: redis.Redis, queue: str
) -> None:
    resilience = make_resilience("redis", drain_slow_start=5)
    app = resilience.runtime.app
    assert "celery_resilience.drain" in app.tasks
    schedule = resilience.beat_schedule(every=5)
    assert schedule["task"] == "celery_resilience.drain"
    assert schedule["schedule"] == 5
    park(resilience, 3, queue)
    park(resilience, 2, queue, breaker="other", tag="other")

    result = app.tasks["celery_resilience.drain"].apply(kwargs={"breaker": "dep"}).get()

    assert result["replayed"] == 3
    assert result["locked"] is False
    assert sent_count(redis_client, queue) == 3
    assert resilience.backout.count(breaker="other") == 2
