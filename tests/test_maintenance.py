"""Maintenance windows end by themselves, once; the drain task leaves a trace of its runs.

Real Redis (db 15, a fresh key prefix); the drain task runs in this process (``apply``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery

from celery_resilience import Resilience, maintenance
from celery_resilience.drain import status as drain_status
from celery_resilience.runtime import forget

pytestmark = pytest.mark.integration


@pytest.fixture
def res(redis_url: str, key_prefix: str) -> Iterator[Resilience]:
    app = Celery("maintenance-test", broker=redis_url, set_as_current=False)
    app.conf.resilience_redis_url = redis_url
    app.conf.resilience_key_prefix = key_prefix
    app.conf.resilience_breakers = {"payments": {"failure_threshold": 3}}
    resilience = Resilience.for_app(app)
    resilience.runtime.send_events = False
    yield resilience
    forget(app)


def test_a_window_forces_open_and_keeps_its_note(res: Resilience) -> None:
    until = res.runtime.now() + 600
    maintenance.start(res.runtime, "payments", until, "gateway upgrade", "alice")

    assert res.breaker("payments").state == "forced_open"
    window = maintenance.windows(res.runtime)["payments"]
    assert (window.until, window.note, window.by) == (until, "gateway upgrade", "alice")
    assert maintenance.end_expired(res.runtime) == []  # not over yet
    assert res.breaker("payments").state == "forced_open"


def test_an_ended_window_resets_its_breaker_once(res: Resilience) -> None:
    maintenance.start(res.runtime, "payments", res.runtime.now() - 1, "done", "alice")
    transitions: list[str] = []
    res.breaker("payments").listeners.append(lambda name, t, state: transitions.append(t))

    first, second = maintenance.end_expired(res.runtime), maintenance.end_expired(res.runtime)

    assert (first, second) == (["payments"], [])
    assert res.breaker("payments").state == "closed"
    assert transitions == ["reset"]
    assert maintenance.windows(res.runtime) == {}


def test_a_breaker_closed_by_hand_is_left_alone_when_its_window_ends(res: Resilience) -> None:
    maintenance.start(res.runtime, "payments", res.runtime.now() - 1, "", "alice")
    res.breaker("payments").force_closed()  # by the CLI: the window stays recorded

    assert maintenance.end_expired(res.runtime) == []
    assert res.breaker("payments").state == "forced_closed"


def test_a_window_set_again_before_the_old_one_is_claimed_is_kept(res: Resilience) -> None:
    # given: a pass read an ended window, then a person set a new one before it claimed it
    maintenance.start(res.runtime, "payments", res.runtime.now() - 1, "old", "alice")
    read = maintenance._all(res.runtime)
    maintenance.start(res.runtime, "payments", res.runtime.now() + 600, "new", "bob")

    # when: the pass claims what it read
    claimed = maintenance._claim(res.runtime, "payments", read["payments"])

    # then: nothing is claimed, the new window and the forced state stay
    assert not claimed
    assert maintenance.windows(res.runtime)["payments"].note == "new"
    assert maintenance.end_expired(res.runtime) == []
    assert res.breaker("payments").state == "forced_open"


def test_a_reset_that_fails_puts_the_window_back_for_the_next_pass(
    res: Resilience, monkeypatch: pytest.MonkeyPatch
) -> None:
    maintenance.start(res.runtime, "payments", res.runtime.now() - 1, "", "alice")
    breaker = res.runtime.breaker("payments")

    def down() -> None:
        raise ConnectionError("Redis went away")

    monkeypatch.setattr(breaker, "reset", down)
    with pytest.raises(ConnectionError):
        maintenance.end_expired(res.runtime)
    assert "payments" in maintenance.windows(res.runtime)  # back, not lost

    monkeypatch.undo()
    assert maintenance.end_expired(res.runtime) == ["payments"]
    assert res.breaker("payments").state == "closed"


def test_the_beat_drain_task_ends_windows_and_says_when_it_ran(res: Resilience) -> None:
    maintenance.start(res.runtime, "payments", res.runtime.now() - 1, "", "alice")
    before = drain_status.read(res.runtime)
    assert before.task_ran_at is None
    assert not before.running

    res.runtime.app.tasks["celery_resilience.drain"].apply()

    status = drain_status.read(res.runtime)
    assert status.task_ran_at is not None
    assert abs(status.task_ran_at - status.now) < 5  # Redis time, just now
    assert status.last_pass_at is not None  # the pass saved its pace
    assert res.breaker("payments").state == "closed"


def test_a_drain_holding_the_lock_reads_running(res: Resilience) -> None:
    from celery_resilience.drain.lock import drain_lock

    with drain_lock(res.runtime, lease=30.0) as lock:
        assert lock is not None
        status = drain_status.read(res.runtime)
    assert status.running
    assert status.lock_seconds_left is not None
    assert 0 < status.lock_seconds_left <= 30
    assert not drain_status.read(res.runtime).running
