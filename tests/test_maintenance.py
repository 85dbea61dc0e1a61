"""Maintenance windows end by themselves, once; the drain task leaves a trace of its runs; a
person's lever racing a window's end keeps what the person did.

Real Redis (db 15, a fresh key prefix); the drain task runs in this process (``apply``); the
races run in two real processes (``tests/support/lever_race.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery

from celery_resilience import Resilience, maintenance
from celery_resilience.drain import status as drain_status
from celery_resilience.runtime import forget
from tests.support.lever_race import stop_key
from tests.support.previous_release import previous_tree
from tests.support.waiting import wait_for
from tests.support.worker_process import spawn

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


def test_a_window_set_again_before_the_old_one_ends_is_kept(res: Resilience) -> None:
    # given: a pass read an ended window, then a person set a new one before it ended it
    maintenance.start(res.runtime, "payments", res.runtime.now() - 1, "old", "alice")
    read = maintenance._all(res.runtime)
    old = maintenance.windows(res.runtime, read)["payments"]
    maintenance.start(res.runtime, "payments", res.runtime.now() + 600, "new", "bob")

    # when: the pass ends what it read, and drops its record
    ended = res.breaker("payments").end_window(old.id)
    dropped = maintenance._drop(res.runtime, "payments", read["payments"])

    # then: nothing changes, the new window and the forced state stay
    assert (ended, dropped) == (False, False)
    assert maintenance.windows(res.runtime)["payments"].note == "new"
    assert maintenance.end_expired(res.runtime) == []
    assert res.breaker("payments").state == "forced_open"


def test_a_window_whose_end_fails_stays_recorded_for_the_next_pass(
    res: Resilience, monkeypatch: pytest.MonkeyPatch
) -> None:
    maintenance.start(res.runtime, "payments", res.runtime.now() - 1, "", "alice")
    breaker = res.runtime.breaker("payments")

    def down(window: str, recorded_at: float = 0.0) -> bool:
        raise ConnectionError("Redis went away")

    monkeypatch.setattr(breaker, "end_window", down)
    with pytest.raises(ConnectionError):
        maintenance.end_expired(res.runtime)
    assert "payments" in maintenance.windows(res.runtime)  # kept, not lost

    monkeypatch.undo()
    assert maintenance.end_expired(res.runtime) == ["payments"]
    assert res.breaker("payments").state == "closed"


def test_a_window_recorded_by_the_release_before_holds_ends_as_it_did(res: Resilience) -> None:
    # given: a window recorded as the previous release wrote it (no id), its breaker forced open
    key = maintenance.windows_key(res.runtime.config.key_prefix)
    old = {"until": res.runtime.now() - 1, "note": "upgrade", "by": "alice", "at": 0.0}
    res.runtime.redis.hset(key, "payments", json.dumps(old))
    res.breaker("payments").force_open()

    # when, then: the pass resets it as that release did, once
    assert maintenance.end_expired(res.runtime) == ["payments"]
    assert res.breaker("payments").state == "closed"
    assert maintenance.windows(res.runtime) == {}


def test_a_record_of_the_release_before_leaves_a_window_of_this_one_alone(
    res: Resilience,
) -> None:
    # given: a window of this release holds the breaker; a previous release's admin recorded
    # an ended window over its record
    maintenance.start(res.runtime, "payments", res.runtime.now() + 600, "now", "bob")
    key = maintenance.windows_key(res.runtime.config.key_prefix)
    old = {"until": res.runtime.now() - 1, "note": "old", "by": "alice", "at": 0.0}
    res.runtime.redis.hset(key, "payments", json.dumps(old))

    # when, then: its end does not reset what the newer window holds
    assert maintenance.end_expired(res.runtime) == []
    assert res.breaker("payments").state == "forced_open"


#: The previous release's levers, run by its own code: ``close`` as its command line does (the
#: order, then the window's record forgotten), ``window <seconds>`` as its admin does (the record
#: without an id, then ``force_open``, which knows no hold).
PREVIOUS_LEVER = """
import sys
from celery import Celery
from celery_resilience import Resilience, maintenance
url, prefix, lever = sys.argv[1:4]
app = Celery("previous", set_as_current=False)
app.conf.update(resilience_redis_url=url, resilience_key_prefix=prefix,
                resilience_breakers={"payments": {"failure_threshold": 3}})
res = Resilience.for_app(app)
if lever == "close":
    res.breaker("payments").force_closed()
    maintenance.forget(res.runtime, "payments")
else:
    maintenance.start(res.runtime, "payments", res.runtime.now() + float(sys.argv[4]), "0.3", "eve")
"""


def previous_lever(tree: Path, redis_url: str, key_prefix: str, *lever: str) -> None:
    command = [sys.executable, "-c", PREVIOUS_LEVER, redis_url, key_prefix, *lever]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        command, check=False, env=env, cwd=tree, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return previous_tree(tmp_path_factory.mktemp("previous-release"))


@pytest.mark.parametrize("closed_first", [True, False], ids=["stale-hold", "held"])
def test_a_window_of_the_previous_release_ends_whatever_hold_this_ones_left(
    res: Resilience, previous: Path, redis_url: str, key_prefix: str, closed_first: bool
) -> None:
    # given: a window of this release holds the breaker (with no end); the previous release's
    # command line closes it (its order keeps the hold), or not, then its admin sets a window
    maintenance.start(res.runtime, "payments", None, "now", "bob")
    if closed_first:
        previous_lever(previous, redis_url, key_prefix, "close")
    previous_lever(previous, redis_url, key_prefix, "window", "0.3")
    assert res.breaker("payments").state == "forced_open"
    until = maintenance.windows(res.runtime)["payments"].until
    assert until is not None
    wait_for(lambda: res.runtime.now() > until, "the window's end", 10.0)

    # when, then: its end resets the breaker, as it would have in the previous release
    assert maintenance.end_expired(res.runtime) == ["payments"]
    assert res.breaker("payments").state == "closed"
    assert maintenance.windows(res.runtime) == {}


#: The previous release's admin, round after round: a window on ``payments`` that ends within
#: milliseconds, then a new one for an hour; after two passes of every beat the breaker must be
#: forced open and the new window recorded. Prints one JSON line: the rounds and the wrong ones.
PREVIOUS_ADMIN = """
import json, random, sys, time
from celery import Celery
from celery_resilience import Resilience, maintenance
url, prefix, rounds, beats = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
app = Celery("previous", set_as_current=False)
app.conf.update(resilience_redis_url=url, resilience_key_prefix=prefix,
                resilience_breakers={"payments": {"failure_threshold": 3}})
res = Resilience.for_app(app)
runtime, client, rng = res.runtime, res.runtime.redis, random.Random()
passes = [f"{prefix}:race:passes:{n}" for n in range(beats)]
wrong = []
for _ in range(rounds):
    res.breaker("payments").reset()
    maintenance.forget(runtime, "payments")
    maintenance.start(runtime, "payments", runtime.now() + rng.uniform(0, 0.004), "old", "eve")
    time.sleep(rng.uniform(0, 0.004))
    maintenance.start(runtime, "payments", runtime.now() + 3600, "new", "eve")
    seen = [int(client.get(k) or 0) for k in passes]
    deadline = time.monotonic() + 30
    while any(int(client.get(k) or 0) < n + 2 for k, n in zip(passes, seen)):
        if time.monotonic() > deadline:
            raise SystemExit("beat made no pass")
        time.sleep(0.001)
    state = res.breaker("payments").state
    window = maintenance.windows(runtime).get("payments")
    if state != "forced_open" or window is None or window.note != "new":
        wrong.append({"state": state, "window": window and window.note})
print(json.dumps({"rounds": rounds, "wrong": len(wrong), "seen": wrong[:5]}))
"""

#: This release's beat, ending windows in a loop, counting its passes, until told to stop.
BEAT = """
import sys
from celery import Celery
from celery_resilience import Resilience, maintenance
url, prefix, n = sys.argv[1:4]
app = Celery("beat", set_as_current=False)
app.conf.update(resilience_redis_url=url, resilience_key_prefix=prefix,
                resilience_breakers={"payments": {"failure_threshold": 3}})
runtime = Resilience.for_app(app).runtime
runtime.send_events = False
while not runtime.redis.exists(f"{prefix}:race:stop"):
    maintenance.end_expired(runtime)
    runtime.redis.incr(f"{prefix}:race:passes:{n}")
"""
PREVIOUS_ROUNDS = 300
BEATS = 2


@pytest.mark.slow
def test_a_window_the_previous_releases_admin_sets_as_one_ends_is_never_undone_by_beat(
    redis_url: str, key_prefix: str, tmp_path: Path, previous: Path
) -> None:
    """Levers of the previous release know no hold: its admin's new window, set as its last one
    ends, is kept whatever this release's beats (several processes) do meanwhile."""
    beats = [
        spawn(
            [sys.executable, "-c", BEAT, redis_url, key_prefix, str(n)],
            os.environ,
            tmp_path / f"beat-{n}.log",
        )
        for n in range(BEATS)
    ]
    command = [sys.executable, "-c", PREVIOUS_ADMIN, redis_url, key_prefix]
    admin = spawn(  # from its own tree, which "-c" puts first on the path
        ["sh", "-c", f'cd "{previous}" && exec "$0" "$@"', *command, str(PREVIOUS_ROUNDS), "2"],
        {**os.environ, "PYTHONPATH": str(previous)},
        tmp_path / "admin.log",
    )
    try:
        assert admin.wait(timeout=600) == 0, (tmp_path / "admin.log").read_text()
    finally:
        app = Celery("race-stop", set_as_current=False)
        app.conf.update(resilience_redis_url=redis_url, resilience_key_prefix=key_prefix)
        Resilience.for_app(app).runtime.redis.set(stop_key(key_prefix), 1)
        for beat in beats:
            beat.wait(timeout=60)
        forget(app)
    report = json.loads((tmp_path / "admin.log").read_text().splitlines()[-1])
    assert report["wrong"] == 0, report
    assert [beat.returncode for beat in beats] == [0] * BEATS


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


#: Rounds per case: before windows ended atomically, 10 of 300 rounds of the command line's
#: ``open`` and 60-103 of 200-300 of the admin's new window went wrong.
RACE_ROUNDS = {"cli-open": 300, "admin-window": 200, "admin-no-end": 200}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(RACE_ROUNDS))
def test_a_lever_pulled_as_a_window_ends_is_never_undone_by_beat(
    redis_url: str, key_prefix: str, tmp_path: Path, case: str
) -> None:
    """``cli-open``: the command line forces the breaker open as its window ends; the admin
    sets a new window, for an hour (``admin-window``) or with no end (``admin-no-end``)."""
    env = {**os.environ, "CLIAPP_PREFIX": key_prefix, "CLIAPP_BROKER": redis_url}
    module = [sys.executable, "-m", "tests.support.lever_race"]
    beat = spawn([*module, "beat"], env, tmp_path / "beat.log")
    person = spawn([*module, "person", case, str(RACE_ROUNDS[case])], env, tmp_path / "person.log")
    try:
        assert person.wait(timeout=600) == 0, (tmp_path / "person.log").read_text()
    finally:
        app = Celery("race-stop", set_as_current=False)
        app.conf.update(resilience_redis_url=redis_url, resilience_key_prefix=key_prefix)
        Resilience.for_app(app).runtime.redis.set(stop_key(key_prefix), 1)
        beat.wait(timeout=60)
        forget(app)
    report = json.loads((tmp_path / "person.log").read_text().splitlines()[-1])
    assert report["wrong"] == 0, report
    assert beat.returncode == 0, (tmp_path / "beat.log").read_text()
