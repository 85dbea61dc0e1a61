"""The real ``celery -A tests.apps.cliapp resilience ...`` command, run in subprocesses.

Each test has its own key prefix and queue (``tests/apps/cliapp.py`` reads them from ``CLIAPP_*``
environment variables); entries are parked from the test process through the same store, and
replayed messages are read from the Redis broker's list of the app's queue. Every celery start
costs most of a second, so read-only commands of one test run side by side (:meth:`Cli.many`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone

import pytest
import redis

from celery_resilience import ParkedTask, maintenance
from celery_resilience.backout import Filter
from celery_resilience.contrib.pytest import delete_prefix
from tests.support.cli import CLI_TIMEOUT, Cli, Result
from tests.support.worker_process import ROOT

pytestmark = pytest.mark.integration


def _boom() -> ValueError:
    try:
        raise ValueError("gateway said no: card declined")
    except ValueError as exc:
        return exc


# -- status --------------------------------------------------------------------------------


def test_status_table_and_json(cli: Cli) -> None:
    for n in range(3):
        cli.park(n, breaker="payments")
    cli.park(3, breaker="payments", status="dead")
    cli.park(4, task_name="cliapp.lookup", breaker="search")
    cli.park(5, task_name="cliapp.notify", breaker=None)
    cli.park(6, task_name="cliapp.notify", breaker=None, status="dead")
    cli.park(7, task_name="cliapp.charge", breaker="legacy")  # not configured, has entries
    search = cli.res.breaker("search")
    for _ in range(3):  # failure_threshold 3: a real trip, so "open until" is set
        search.acquire().failure()
    assert search.state == "open"
    open_until = search.snapshot()["open_until"]
    cli.res.breaker("payments").force_open()
    legacy = cli.res.breaker("legacy")  # closed, with some calls in its window
    legacy.acquire().success()
    legacy.acquire().failure()  # carries the deferred success with it

    table, as_json = cli.many(("status",), ("status", "--json"))
    assert table.returncode == 0, str(table)
    assert as_json.returncode == 0, str(as_json)

    data = as_json.json()
    breakers = data["breakers"]
    assert set(breakers) == {"payments", "search", "legacy"}
    assert breakers["payments"]["state"] == "forced_open"
    assert (breakers["payments"]["parked"], breakers["payments"]["dead"]) == (3, 1)
    assert breakers["search"]["state"] == "open"
    assert breakers["search"]["opened_total"] == 1
    assert breakers["search"]["failures_total"] == 3
    assert breakers["search"]["open_until"] == pytest.approx(open_until)
    assert (breakers["search"]["parked"], breakers["search"]["dead"]) == (1, 0)
    assert breakers["legacy"]["state"] == "closed"
    assert breakers["legacy"]["consecutive_failures"] == 1
    assert (breakers["legacy"]["window_calls"], breakers["legacy"]["window_failures"]) == (2, 1)
    assert (breakers["legacy"]["parked"], breakers["legacy"]["dead"]) == (1, 0)
    assert data["no_breaker"] == {"parked": 1, "dead": 1}

    lines = table.stdout.splitlines()
    assert lines[0].split() == [
        "breaker", "state", "consecutive", "window", "opened", "open", "until", "(UTC)", "bulkhead",
        "parked", "dead",
    ]  # fmt: skip
    rows = {line.split()[0]: line for line in lines[2:] if not line.startswith("without")}
    assert set(rows) == {"legacy", "payments", "search"}
    until = datetime.fromtimestamp(open_until, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    assert rows["search"].split()[1] == "open"
    assert until in rows["search"]
    assert rows["search"].split()[-2:] == ["1", "0"]
    assert rows["payments"].split()[1] == "forced_open"
    assert rows["payments"].split()[-2:] == ["3", "1"]
    assert rows["legacy"].split() == [
        "legacy", "closed", "1", "1/2", "failed", "0", "-", "-", "1", "0"
    ]  # fmt: skip
    assert lines[-1] == "without breaker: 1 parked, 1 dead"


# -- list and show -------------------------------------------------------------------------


def test_list_filters_paging_and_json(cli: Cli) -> None:
    entries = [
        cli.park(0, breaker="payments", reason="breaker_open"),
        cli.park(1, breaker="payments", reason="retries_exhausted"),
        cli.park(2, task_name="cliapp.lookup", breaker="search", reason="retries_exhausted"),
        cli.park(3, breaker="payments", reason="park_on", status="dead"),
        cli.park(4, task_name="cliapp.notify", breaker=None, reason="delay_too_long"),
        cli.park(5, breaker="payments", reason="breaker_open"),
        cli.park(6, task_name="cliapp.lookup", breaker="search", reason="redelivered"),
    ]
    newest_first = [e.id for e in reversed(entries)]

    (
        all_json,
        by_breaker,
        by_reason,
        by_status,
        no_breaker,
        page2,
        page3,
        combined,
        table,
        bad_page,
    ) = cli.many(
        ("list", "--json"),
        ("list", "--breaker", "payments", "--json"),
        ("list", "--reason", "retries_exhausted", "--json"),
        ("list", "--status", "dead", "--json"),
        ("list", "--breaker", "-", "--json"),
        ("list", "--limit", "3", "--page", "2", "--json"),
        ("list", "--limit", "3", "--page", "3", "--json"),
        ("list", "--breaker", "payments", "--status", "parked", "--limit", "2", "--json"),
        ("list", "--limit", "4"),
        ("list", "--page", "0"),
    )
    for result in (all_json, by_breaker, by_reason, by_status, no_breaker, page2, page3, table):
        assert result.returncode == 0, str(result)

    def ids(result: Result) -> list[str]:
        return [e["id"] for e in result.json()]

    assert ids(all_json) == newest_first
    first = all_json.json()[0]
    assert first["task_id"] == entries[6].task_id
    assert first["args"] == ["order-6"]
    assert first["kwargs"] == {"amount": 6, "note": "naïve ☃"}
    assert first["reason"] == "redelivered"
    assert ids(by_breaker) == [entries[i].id for i in (5, 3, 1, 0)]
    assert ids(by_reason) == [entries[i].id for i in (2, 1)]
    assert ids(by_status) == [entries[3].id]
    assert by_status.json()[0]["status"] == "dead"
    assert ids(no_breaker) == [entries[4].id]
    assert no_breaker.json()[0]["breaker"] is None
    assert ids(page2) == newest_first[3:6]
    assert ids(page3) == newest_first[6:]
    assert ids(combined) == [entries[5].id, entries[1].id]

    lines = table.stdout.splitlines()
    assert lines[0].split()[:5] == ["id", "parked", "(UTC)", "task", "breaker"]
    assert [line.split()[0] for line in lines[2:-1]] == [i[:8] for i in newest_first[:4]]
    assert lines[2].split()[3:6] == ["cliapp.lookup", "search", "redelivered"]
    assert lines[-1] == "1-4 of 7 (page 1 of 2); next: --page 2"
    assert bad_page.returncode == 1
    assert "--page" in bad_page.stderr


def test_bad_filter_values_are_refused(cli: Cli) -> None:
    reason, status = cli.many(
        ("list", "--reason", "no_such_reason"), ("purge", "--status", "lost", "--yes")
    )
    assert reason.returncode == 2, str(reason)  # click's usage error
    assert "no_such_reason" in reason.stderr
    assert status.returncode == 2, str(status)
    assert "lost" in status.stderr


def test_show_args_kwargs_and_traceback(cli: Cli) -> None:
    entry = cli.park(
        1,
        reason="retries_exhausted",
        exc=_boom(),
        args=["order-1", {"lines": [1, 2]}],
        kwargs={"amount": 42, "currency": "EUR"},
        retries=3,
    )
    human, as_json = cli.many(("show", entry.id), ("show", entry.id, "--json"))
    assert human.returncode == 0, str(human)
    assert as_json.returncode == 0, str(as_json)

    data = as_json.json()
    assert data["id"] == entry.id
    assert data["task_name"] == "cliapp.charge"
    assert data["task_id"] == entry.task_id
    assert data["args"] == ["order-1", {"lines": [1, 2]}]
    assert data["kwargs"] == {"amount": 42, "currency": "EUR"}
    assert data["exc_type"] == "ValueError"
    assert data["exc_message"] == "gateway said no: card declined"
    assert data["traceback"] == entry.traceback
    assert "Traceback (most recent call last)" in data["traceback"]
    assert data["retries"] == 3
    assert data["reason"] == "retries_exhausted"

    out = human.stdout
    assert f'id: "{entry.id}"' in out
    assert 'args: ["order-1", {"lines": [1, 2]}]' in out
    assert 'kwargs: {"amount": 42, "currency": "EUR"}' in out
    assert "traceback:" in out
    assert "raise ValueError" in out
    assert "ValueError: gateway said no: card declined" in out


# -- replay and drain ----------------------------------------------------------------------


def test_replay_ids_then_all_of_one_breaker(cli: Cli) -> None:
    pay = [cli.park(n, breaker="payments") for n in range(4)]
    search = [cli.park(10 + n, task_name="cliapp.lookup", breaker="search") for n in range(2)]
    assert cli.published() == []

    result = cli("replay", pay[0].id, search[1].id)
    assert f"replayed {pay[0].id} -> cliapp.charge[{pay[0].task_id}]" in result.stdout
    assert "2 replayed, 0 failed" in result.stdout
    assert set(cli.ids()) == {pay[1].id, pay[2].id, pay[3].id, search[0].id}
    headers = cli.published()
    assert [h["id"] for h in headers] == [pay[0].task_id, search[1].task_id]
    assert [h["task"] for h in headers] == ["cliapp.charge", "cliapp.lookup"]
    assert headers[0]["resilience_replays"] == 1
    assert headers[0]["_body"][0] == pay[0].args  # same args and kwargs
    assert headers[0]["_body"][1] == pay[0].kwargs

    result = cli("replay", "--all", "--breaker", "payments", "--yes", "--json")
    replayed = result.json()["replayed"]
    assert sorted(r["task_id"] for r in replayed) == sorted(e.task_id for e in pay[1:])
    assert result.json()["failed"] == []
    assert cli.ids() == [search[0].id]  # the other breaker's entry is untouched
    assert sorted(h["id"] for h in cli.published()[2:]) == sorted(e.task_id for e in pay[1:])
    assert len(cli.published()) == 5


def test_replay_needs_ids_or_all(cli: Cli) -> None:
    entry = cli.park(0)
    neither, both = cli.many(("replay",), ("replay", entry.id, "--all"))
    for result in (neither, both):
        assert result.returncode == 1, str(result)
        assert "--all" in result.stderr
    assert cli.ids() == [entry.id]
    assert cli.published() == []


def test_drain_is_gated_by_the_breaker(cli: Cli) -> None:
    pay = [cli.park(n, breaker="payments") for n in range(5)]
    other = cli.park(9, task_name="cliapp.lookup", breaker="search")
    payments = cli.res.breaker("payments")
    payments.force_open()

    report = cli("drain", "--breaker", "payments", "--json").json()
    assert report["replayed"] == 0
    assert report["skipped"] == 5  # due, held back by the open breaker, which says so
    forced = "the breaker is forced open: 'close' or 'reset' payments to let them go"
    assert report["held_back"]["payments"] == {"entries": 5, "why": forced}
    assert cli.store.count(Filter("payments")) == 5
    # The person's drain of every breaker: the search entry goes, payments' are held, and
    # the summary is printed once (the drain's own summary log line is for workers).
    human = cli("drain")
    assert human.stdout.splitlines() == [
        human.stdout.splitlines()[0],
        f"held back 5 of breaker 'payments': {forced}",
    ]
    assert human.stdout.startswith("replayed 1, dead 0, held back 5, errors 0 in ")
    assert "Drain: replayed" not in human.stderr
    assert [h["id"] for h in cli.published()] == [other.task_id]

    payments.reset()  # closed: everything due goes
    report = cli("drain", "--breaker", "payments", "--json").json()
    assert (report["replayed"], report["skipped"], report["errors"]) == (5, 0, 0)
    assert cli.store.count(Filter("payments")) == 0
    assert cli.ids() == []
    assert sorted(h["id"] for h in cli.published()[1:]) == sorted(e.task_id for e in pay)
    assert "held_back" in report
    assert report["held_back"] == {}


# -- purge ---------------------------------------------------------------------------------


def test_purge_needs_yes_and_respects_filters(cli: Cli) -> None:
    pay = [cli.park(n, breaker="payments") for n in range(3)]
    dead = cli.park(3, breaker="payments", status="dead")
    search = [cli.park(10 + n, task_name="cliapp.lookup", breaker="search") for n in range(2)]
    everything = set(cli.ids())

    refused_all, refused_search = cli.many(("purge",), ("purge", "--breaker", "search"))
    for refused in (refused_all, refused_search):
        assert refused.returncode == 1, str(refused)
        assert "--yes" in refused.stderr
    assert "6 parked task(s)" in refused_all.stderr
    assert "2 parked task(s)" in refused_search.stderr
    assert set(cli.ids()) == everything

    assert cli("purge", "--breaker", "search", "--yes").stdout.strip() == "purged 2 parked task(s)"
    assert set(cli.ids()) == {e.id for e in pay} | {dead.id}
    assert cli("purge", "--status", "dead", "--yes", "--json").json() == {"purged": 1}
    assert set(cli.ids()) == {e.id for e in pay}
    cli("purge", "--yes")
    assert cli.ids() == []
    assert cli.store.count() == 0
    assert all(e.id not in cli.ids() for e in search)


# -- steering the shared breaker -----------------------------------------------------------


def test_a_lever_of_the_command_line_ends_a_maintenance_window(cli: Cli) -> None:
    # given: payments forced open from the admin for a window that has ended
    runtime = cli.res.runtime
    maintenance.start(runtime, "payments", runtime.now() - 1, "upgrade", "alice")

    # when: a person resets it, then forces it open for good, from the command line
    cli("reset", "payments")
    cli("open", "payments")

    # then: the old window is gone, and the beat drain task leaves the breaker forced open
    assert maintenance.windows(runtime) == {}
    assert maintenance.end_expired(runtime) == []
    assert cli.res.breaker("payments").state == "forced_open"


def test_open_close_reset_change_the_shared_state(cli: Cli) -> None:
    breaker = cli.res.breaker("payments")
    assert breaker.state == "closed"

    assert cli("open", "payments").stdout.strip() == "breaker 'payments' is now forced_open"
    assert breaker.state == "forced_open"  # type: ignore[comparison-overlap]  # it changed
    assert cli.res.breaker("search").state == "closed"

    assert cli("close", "payments", "--json").json()["state"] == "forced_closed"
    assert breaker.state == "forced_closed"

    for _ in range(3):  # tripped for real, reset must bring it back
        cli.res.breaker("search").acquire().failure()
    assert cli.res.breaker("search").state == "open"
    reset_pay, reset_search = cli.many(("reset", "payments"), ("reset", "search"))
    assert reset_pay.returncode == 0, str(reset_pay)
    assert reset_search.stdout.strip() == "breaker 'search' is now closed"
    assert breaker.state == "closed"
    assert cli.res.breaker("search").state == "closed"


def test_unknown_breaker_and_unknown_entry(cli: Cli) -> None:
    entry = cli.park(0)
    missing = "0" * 32
    commands = {
        "open": ("open", "nope"),
        "reset": ("reset", "nope"),
        "show": ("show", missing),
        "replay": ("replay", missing),
        "drain": ("drain", "--breaker", "nope"),
        "list": ("list", "--breaker", "nope"),
        "purge": ("purge", "--breaker", "nope", "--yes"),
        "replay --all": ("replay", "--all", "--breaker", "nope"),
    }
    results = dict(zip(commands, cli.many(*commands.values()), strict=True))
    for result in results.values():
        assert result.returncode == 1, str(result)
    for name in ("open", "reset"):
        assert "unknown breaker 'nope'" in results[name].stderr
        assert "payments, search" in results[name].stderr  # the known ones are named
    assert f"no parked task with id, id prefix or task id {missing!r}" in results["show"].stderr
    assert f"could not replay {missing}: no parked task" in results["replay"].stderr
    for name in ("drain", "list", "purge", "replay --all"):  # a typo, not an empty store
        assert "unknown breaker 'nope'" in results[name].stderr, str(results[name])
    assert cli.ids() == [entry.id]  # nothing happened to the real entry
    assert cli.res.breaker("payments").state == "closed"
    assert "nope" not in cli.res.runtime.breaker_names()
    assert cli.published() == []


def test_replay_of_a_task_this_process_lacks_sends_it_by_name(cli: Cli) -> None:
    # The CLI's process need not know every task: a worker that has it will run it.
    gone = cli.park(0, task_name="cliapp.served_elsewhere")
    cli("replay", gone.id)
    assert cli.ids() == []
    assert [h["task"] for h in cli.published()] == ["cliapp.served_elsewhere"]


def test_entry_whose_arguments_no_longer_fit_is_dead_not_a_poison(cli: Cli) -> None:
    """A deploy changed the task's signature while entries were parked: they need a person.

    Neither the drain (which would retry it forever as if the broker had refused it) nor a
    replay (which would crash with a traceback) may treat it as a publish failure.
    """
    good = [cli.park(n) for n in range(3)]
    bad = cli.park(9, kwargs={"amount": 1, "coupon": "X"})  # charge() has no ``coupon``

    replay = cli("replay", bad.id, rc=1)
    assert "coupon" in replay.stderr
    assert "Traceback" not in replay.stderr
    assert cli.store.get(bad.id) is not None

    report = cli("drain", "--json").json()
    assert (report["replayed"], report["dead"], report["errors"]) == (3, 1, 0)
    assert sorted(h["id"] for h in cli.published()) == sorted(e.task_id for e in good)
    dead = cli.store.get(bad.id)
    assert dead is not None
    assert dead.status == "dead"
    # The dead reason says what Celery objected to.
    assert dead.dead_reason == "bad_arguments: charge() got an unexpected keyword argument 'coupon'"


# -- on a terminal: progress and --watch ------------------------------------------------------


def test_a_progress_bar_only_for_a_person_at_a_terminal() -> None:
    from celery_resilience.cli.output import progress_wanted

    assert progress_wanted(as_json=False, isatty=True)
    assert not progress_wanted(as_json=True, isatty=True)  # JSON is for scripts
    assert not progress_wanted(as_json=False, isatty=False)  # a pipe, a file, a log
    assert not progress_wanted(as_json=True, isatty=False)


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str  # from a pseudo-terminal when the command had one


def side_by_side(*runs: tuple[Cli, tuple[str, ...], bool]) -> list[Run]:
    """Run ``(world, args, on_terminal)`` commands side by side. With ``on_terminal`` the
    command's stderr is a pseudo-terminal of its own, as for a person at a terminal; stdout
    stays a pipe either way (as when the results are redirected)."""
    import threading

    def read_all(fd: int, into: list[bytes]) -> None:
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:  # EIO: every process holding the terminal's other side is gone
                return
            if not data:
                return
            into.append(data)

    started = []
    for world, args, on_terminal in runs:
        master, slave = os.openpty() if on_terminal else (-1, subprocess.PIPE)
        command = [sys.executable, "-m", "celery", "-A", "tests.apps.cliapp", "resilience", *args]
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**os.environ, **world.env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=slave,
            text=True,
        )
        chunks: list[bytes] = []
        if on_terminal:
            os.close(slave)
            threading.Thread(target=read_all, args=(master, chunks), daemon=True).start()
        started.append((process, master, chunks))
    results = []
    for process, master, chunks in started:
        stdout, stderr = process.communicate(timeout=CLI_TIMEOUT)
        if master >= 0:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not chunks:  # the reader may trail
                time.sleep(0.01)
            os.close(master)
            stderr = b"".join(chunks).decode(errors="replace")
        results.append(Run(process.returncode, stdout, stderr))
    return results


@pytest.fixture
def other_cli(redis_url: str, redis_client: redis.Redis) -> Iterator[Cli]:
    """A second world with a prefix (so a drain lock) of its own: a replay and a drain, which
    share their world's lock, can then run side by side."""
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    env = {"CLIAPP_PREFIX": prefix, "CLIAPP_BROKER": redis_url, "CLIAPP_QUEUE": f"{prefix}-queue"}
    world = Cli(env, redis_client)
    yield world
    world.res.runtime.close()
    delete_prefix(redis_client, prefix)


def test_drain_and_replay_show_progress_on_a_terminal_and_stay_quiet_otherwise(
    cli: Cli, other_cli: Cli
) -> None:
    for n in range(150):  # two drain batches of 100 at most
        cli.park(n, breaker="payments")
    for n in range(120):
        other_cli.park(n, task_name="cliapp.lookup", breaker="search")

    drain, replay = side_by_side(
        (cli, ("drain", "--breaker", "payments"), True),
        (other_cli, ("replay", "--all", "--breaker", "search", "--yes"), True),
    )
    assert drain.returncode == 0, drain
    assert re.search(r"draining  \[#{24}-{12}\]  100/150", drain.stderr)  # after one batch
    # Full, and its line ended at once; the summary is on stdout only, not logged beside it.
    assert re.search(r"\[#{36}\]  150/150(\x1b\[\?25h)?\r\n", drain.stderr), drain.stderr
    assert "Drain: replayed" not in drain.stderr
    assert drain.stdout.startswith("replayed 150, dead 0")  # the results keep stdout
    assert replay.returncode == 0, replay
    assert re.search(r"replaying  \[#{36}\]  120/120", replay.stderr)
    # Each replay's log line goes over the bar's line (cleared first), never after the bar.
    assert len(re.findall(r"\r\x1b\[KReplayed cliapp\.lookup\[", replay.stderr)) == 120
    assert not re.search(r"/120Replayed", replay.stderr)
    assert replay.stdout.splitlines()[-1] == "120 replayed, 0 failed"
    assert cli.ids() == other_cli.ids() == []

    for n in range(3):
        cli.park(200 + n, breaker="payments")
        other_cli.park(200 + n, task_name="cliapp.lookup", breaker="search")
    as_json, piped = side_by_side(
        (cli, ("drain", "--breaker", "payments", "--json"), True),
        (other_cli, ("replay", "--all", "--breaker", "search", "--yes"), False),
    )
    assert as_json.returncode == 0, as_json
    assert "draining" not in as_json.stderr  # a terminal, but --json: no bar
    assert json.loads(as_json.stdout)["replayed"] == 3
    assert piped.returncode == 0, piped
    assert "replaying" not in piped.stderr  # not a terminal: no bar,
    assert piped.stderr.count("Replayed cliapp.lookup[") == 3  # the log lines as ever
    assert "\r" not in piped.stderr
    assert cli.ids() == other_cli.ids() == []
    assert (len(cli.published()), len(other_cli.published())) == (153, 123)


def test_status_watch_refreshes_until_ctrl_c(cli: Cli) -> None:
    import signal
    import threading

    cli.park(1, breaker="payments")
    command = [sys.executable, "-m", "celery", "-A", "tests.apps.cliapp", "resilience", "status"]
    process = subprocess.Popen(
        [*command, "--watch", "--interval", "0.3"],
        cwd=ROOT,
        env={**os.environ, **cli.env},
        # Ctrl-C as a terminal delivers it: a suite started in the background of a shell
        # without job control hands its children SIGINT ignored.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    errors: list[str] = []
    # Each pipe is read by a thread of its own as the command writes: a pipe nobody reads fills
    # and stops the command, and ``communicate`` would race the reader for stdout.
    readers = [
        threading.Thread(target=lambda: lines.extend(process.stdout or ()), daemon=True),
        threading.Thread(target=lambda: errors.extend(process.stderr or ()), daemon=True),
    ]
    for reader in readers:
        reader.start()

    def tables() -> int:
        return sum(1 for line in list(lines) if line.split()[:2] == ["breaker", "state"])

    deadline = time.monotonic() + CLI_TIMEOUT
    while tables() < 2 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert tables() >= 2, "".join(lines)
        cli.res.breaker("payments").force_open()  # the next refresh shows it
        seen = len(lines)
        while not any("forced_open" in line for line in lines[seen:]):
            assert time.monotonic() < deadline, "".join(lines)
            time.sleep(0.05)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=CLI_TIMEOUT)
        finally:
            if process.poll() is None:  # the assertion below says so, and no process is left
                process.kill()
                process.wait()
            for reader in readers:
                reader.join(timeout=5)
    stderr = "".join(errors)
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert tables() >= 3
    stamps = [line for line in lines if "(Ctrl-C to stop)" in line]
    assert len(stamps) >= 3
    assert "every 0.3s" in stamps[0]
    rows = [line.split() for line in lines if line.startswith("payments ")]
    assert rows[0][1] == "closed"
    assert rows[-1][1] == "forced_open"
    assert rows[0][-2:] == ["1", "0"]  # parked, dead


# -- finding an entry, a page that fits, masked arguments ---------------------------------------


def test_show_finds_an_entry_by_task_id_and_by_a_unique_id_prefix(cli: Cli) -> None:
    entries = [cli.park(n) for n in range(40)]
    retried = cli.park(41, task_id=entries[5].task_id, retries=2)  # the same task, parked again
    target = entries[7]
    by_first: dict[str, list[ParkedTask]] = {}
    for e in [*entries, retried]:
        by_first.setdefault(e.id[0], []).append(e)
    shared, crowd = max(by_first.items(), key=lambda item: len(item[1]))
    assert len(crowd) >= 2  # 41 ids over 16 first characters

    by_task, by_prefix, ambiguous, twice, none = cli.many(
        ("show", target.task_id, "--json"),
        ("show", target.id[:8], "--json"),
        ("show", shared),
        ("show", entries[5].task_id),
        ("show", "no-such-task"),
    )
    assert by_task.returncode == by_prefix.returncode == 0, (by_task, by_prefix)
    assert by_task.json()["id"] == by_prefix.json()["id"] == target.id

    assert ambiguous.returncode == 1, str(ambiguous)
    assert ambiguous.stdout == ""
    first, *candidates = ambiguous.stderr.strip().splitlines()
    assert first.startswith(f"Error: {shared!r} is ambiguous: ")
    assert "match by id prefix; give one id:" in first
    listed = [line.split()[0] for line in candidates]
    assert set(listed) <= {e.id for e in crowd}
    assert len(listed) == min(len(crowd), 10)

    assert twice.returncode == 1, str(twice)
    assert "2 entries match by task id" in twice.stderr
    assert {line.split()[0] for line in twice.stderr.splitlines()[1:]} == {
        entries[5].id,
        retried.id,
    }
    assert none.returncode == 1
    assert "no parked task with id, id prefix or task id 'no-such-task'" in none.stderr


def test_list_fits_120_columns_with_the_error_and_dead_reason_and_says_n_of_m(cli: Cli) -> None:
    long = {"note": "x" * 200, "lines": [{"sku": "é" * 30, "qty": 2}] * 5}
    for n in range(6):
        cli.park(n, exc=_boom(), kwargs={"amount": n, **long})
    dead = cli.park(
        6, status="dead", dead_reason="max_replays: cliapp.charge[x] was replayed 5 times"
    )
    first, last, beyond, shown = cli.many(
        ("list", "--limit", "3"),
        ("list", "--limit", "3", "--page", "3"),
        ("list", "--limit", "3", "--page", "9"),
        ("show", dead.id[:8]),
    )
    for result in (first, last, beyond, shown):
        assert result.returncode == 0, str(result)
    lines = first.stdout.splitlines()
    assert all(len(line) <= 120 for line in lines), "\n".join(lines)
    assert len(lines) == 2 + 3 + 1
    assert lines[0].split()[:3] == ["id", "parked", "(UTC)"]
    assert lines[-1] == "1-3 of 7 (page 1 of 3); next: --page 2"
    top = lines[2]  # the newest: the dead one
    assert top.startswith(dead.id[:8])
    assert "dead (max_replays)" in top
    assert "cliapp.charge[x] was" in top  # the dead reason beyond its code
    assert "ValueError: gateway said" in lines[3]
    assert "'order-5', am" in lines[3]
    # The same time, in the same format, in list and show.
    parked = re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", top)
    assert parked is not None
    assert f"parked_at: {parked.group(0)} UTC" in shown.stdout
    assert last.stdout.splitlines()[-1] == "7-7 of 7 (page 3 of 3)"
    assert beyond.stdout.strip().splitlines()[-1] == "none of 7 on page 9 (the last is 3)"


def test_sensitive_arguments_are_masked_in_list_show_and_json(cli: Cli) -> None:
    # cliapp sets resilience_sensitive_keys = ["card_token"].
    plain = cli.park(1, kwargs={"amount": 1, "card_token": "tok_visa_4242"})
    nested = cli.park(2, args=[{"customer": {"Card_Token": "tok_amex_0005"}}], kwargs={})
    hidden = cli.park(
        3,
        args=["order-3", "4111 1111 1111 1111"],
        options={"argsrepr": "('order-3', '<card>')", "kwargsrepr": "{}"},
    )
    results = cli.many(
        ("list",),
        ("list", "--json"),
        ("show", plain.id),
        ("show", plain.id, "--json"),
        ("show", nested.id, "--json"),
        ("show", hidden.id, "--json"),
        ("show", hidden.id),
    )
    for result in results:
        assert result.returncode == 0, str(result)
        for secret in ("tok_visa_4242", "tok_amex_0005", "4111 1111"):
            assert secret not in result.stdout, (secret, str(result))
    listing, as_json, human, plain_json, nested_json, hidden_json, hidden_human = results
    assert "card_token='***'" in listing.stdout
    assert "'order-3', '<card>'" in listing.stdout
    assert {e["id"]: e["kwargs"] for e in as_json.json()}[plain.id]["card_token"] == "***"
    assert 'card_token": "***"' in human.stdout
    assert plain_json.json()["kwargs"] == {"amount": 1, "card_token": "***"}
    assert nested_json.json()["args"] == [{"customer": {"Card_Token": "***"}}]
    assert hidden_json.json()["args"] == "('order-3', '<card>')"  # as Celery's events carry it
    assert "<card>" in hidden_human.stdout
    stored = cli.store.get(plain.id)  # masked on the way out only
    assert stored is not None
    assert stored.kwargs["card_token"] == "tok_visa_4242"


def test_a_sensitive_argument_passed_by_position_is_masked_in_list_show_and_json(
    cli: Cli,
) -> None:
    # cliapp.charge(self, order_id, amount=1, note="", currency="EUR"): "note" is made sensitive
    cli.env["CLIAPP_CONF"] = json.dumps({"resilience_sensitive_keys": ["card_token", "note"]})
    token = "tok_mc_5555"
    by_position = cli.park(
        1,
        args=["order-1", 5, token],
        kwargs={},
        exc=ValueError(f"gateway refused note {token}"),
    )
    unknown = cli.park(2, task_name="cliapp.gone", args=[token], kwargs={"amount": 2})
    results = cli.many(
        ("list",),
        ("list", "--json"),
        ("show", by_position.id),
        ("show", by_position.id, "--json"),
        ("show", unknown.id, "--json"),
    )
    for result in results:
        assert result.returncode == 0, str(result)
        assert token not in result.stdout, str(result)
    listing, as_json, human, shown, gone = results
    assert "'order-1', 5, '***'" in listing.stdout
    assert "ValueError: gateway refused" in listing.stdout  # cut to the column
    assert {e["id"]: e["args"] for e in as_json.json()}[by_position.id] == ["order-1", 5, "***"]
    assert "gateway refused note ***" in human.stdout
    assert shown.json()["args"] == ["order-1", 5, "***"]
    assert shown.json()["exc_message"] == "gateway refused note ***"
    assert token not in shown.json()["traceback"]
    # A task this process does not know: its positions can't be named, so all are masked.
    assert gone.json()["args"] == ["***"]
    assert gone.json()["kwargs"] == {"amount": 2}


def test_list_and_show_escape_the_control_sequences_of_stored_text(cli: Cli) -> None:
    """A stored error that writes the clipboard (OSC 52), reorders the line (a bidi override)
    or holds C1 and C0 controls is shown escaped, never sent to the terminal as it is."""
    controls = ("\x1b", "\x07", "\x9b", "\u202e", "\r", "\x00")
    nasty = "\x1b]52;c;ZWNobyBwd25lZA==\x07 \u202eevil\u202c \x9b31m red \r over \x00"
    entry = cli.park(1, exc=ConnectionError(nasty), kwargs={"note": nasty})
    results = cli.many(("list",), ("show", entry.id), ("list", "--json"))
    for result in results:
        assert result.returncode == 0, str(result)
        assert not [c for c in controls if c in result.stdout], str(result)
    listing, shown, as_json = results
    assert "\\x1b]52;c;" in listing.stdout  # the rest is cut to the column
    assert "\\x1b]52;c;" in shown.stdout
    assert "\\u202eevil" in shown.stdout
    assert "\\x9b31m" in shown.stdout
    assert as_json.json()[0]["exc_message"] == nasty  # JSON escapes them itself


# -- replay --all asks; errors name the server; levers take a reason; --help has examples ------


def on_terminal_stdin(world: Cli, args: tuple[str, ...], answer: str) -> Result:
    """The command with a pseudo-terminal for stdin (a person at it), answering ``answer``."""
    master, slave = os.openpty()
    command = [sys.executable, "-m", "celery", "-A", "tests.apps.cliapp", "resilience", *args]
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, **world.env},
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(slave)
    try:
        os.write(master, answer.encode() + b"\n")  # read once the question is asked
        stdout, stderr = process.communicate(timeout=CLI_TIMEOUT)
    finally:
        os.close(master)
    return Result(args, process.returncode, stdout, stderr)


def test_replay_all_asks_first_and_dry_run_sends_nothing(cli: Cli) -> None:
    entries = [cli.park(n) for n in range(3)]
    every = ("replay", "--all", "--breaker", "payments")
    scripted, dry, dry_json = cli.many(
        every, (*every, "--dry-run"), (*every, "--dry-run", "--json")
    )
    assert scripted.returncode == 1, str(scripted)  # no terminal to ask at: --yes or nothing
    assert "this would replay 3 parked task(s); add --yes to do it" in scripted.stderr
    assert dry.returncode == 0, str(dry)
    assert dry.stdout.splitlines()[-1] == "3 would be replayed (dry run: nothing sent)"
    assert {line.split()[2] for line in dry.stdout.splitlines()[:-1]} == {e.id for e in entries}
    assert {e["id"] for e in dry_json.json()["would_replay"]} == {e.id for e in entries}
    assert cli.published() == []

    no = on_terminal_stdin(cli, every, "n")
    assert no.returncode == 1, str(no)
    assert "Replay 3 parked task(s) now, whatever their breaker says? [y/N]" in no.stderr
    assert "nothing replayed" in no.stderr
    assert cli.published() == []
    assert len(cli.ids()) == 3

    yes = on_terminal_stdin(cli, every, "y")
    assert yes.returncode == 0, str(yes)
    assert yes.stdout.splitlines()[-1] == "3 replayed, 0 failed"
    assert sorted(h["id"] for h in cli.published()) == sorted(e.task_id for e in entries)
    assert cli.ids() == []


def test_replay_takes_a_task_id_or_a_prefix_as_show_does(cli: Cli) -> None:
    first, second = cli.park(1), cli.park(2)
    result = cli("replay", first.task_id, second.id[:10])
    assert result.stdout.splitlines()[-1] == "2 replayed, 0 failed"
    assert [h["id"] for h in cli.published()] == [first.task_id, second.task_id]


def test_an_unreachable_server_is_named_in_one_line_without_its_password(cli: Cli) -> None:
    from tests.support.redis_server import free_port

    down = f"127.0.0.1:{free_port()}"
    redis_down = Cli({**cli.env, "CLIAPP_REDIS": f"redis://:s3cret@{down}/0"}, cli.client)
    broker_down = Cli({**cli.env, "CLIAPP_BROKER": f"redis://u:s3cret@{down}/0",
                       "CLIAPP_REDIS": cli.env["CLIAPP_BROKER"]}, cli.client)  # fmt: skip
    entry = cli.park(1)
    try:
        results = [
            *redis_down.many(("status",), ("list",), ("drain",), ("show", entry.id)),
            broker_down("replay", entry.id, rc=None),
        ]
    finally:
        redis_down.res.runtime.close()
        broker_down.res.runtime.close()
    for result in results:
        assert result.returncode == 1, str(result)
        assert "Traceback" not in result.stderr
        assert "s3cret" not in result.stderr + result.stdout
        assert down in result.stderr, str(result)
    for result in results[:4]:
        assert f"(Redis at redis://:***@{down}/0)" in result.stderr, str(result)
    assert f"(broker at redis://u:***@{down}/0)" in results[4].stderr
    assert cli.ids() == [entry.id]  # nothing lost on the way


def test_open_takes_a_reason_that_is_logged_with_who_and_shown(cli: Cli) -> None:
    opened = cli("open", "payments", "--reason", "gateway maintenance until 03:00", "--json")
    assert opened.json()["state"] == "forced_open"
    assert opened.json()["reason"] == "gateway maintenance until 03:00"
    assert re.search(
        r"Breaker 'payments' forced open from the command line by \S+@\S+: "
        r"gateway maintenance until 03:00",
        opened.stderr,
    ), opened.stderr
    closed = cli("reset", "payments")
    assert closed.stdout.strip() == "breaker 'payments' is now closed"
    assert "reset from the command line by" in closed.stderr
    assert "no reason given" in closed.stderr


def test_every_command_has_examples_in_its_help(cli: Cli) -> None:
    from celery_resilience.cli import resilience

    names = sorted(resilience.commands)
    for name, result in zip(names, cli.many(*((name, "--help") for name in names)), strict=True):
        assert result.returncode == 0, str(result)
        assert "Examples:" in result.stdout, str(result)
        assert f"celery -A proj resilience {name}" in result.stdout, str(result)
