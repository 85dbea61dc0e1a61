"""A bad setting stops a real worker at start, naming the setting; nothing runs half-configured."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REDIS_URL

pytestmark = pytest.mark.slow

APP = """
from celery import Celery
from celery_resilience import ResilientTask

app = Celery("badapp", broker={broker!r})
app.conf.resilience_key_prefix = "test-worker-start"
app.conf.resilience_breakers = {{"dep": {{"failure_threshold": -1}}}}


@app.task(base=ResilientTask, breaker="dep")
def charge(order_id):
    return order_id
"""


def run_celery(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "badapp.py").write_text(textwrap.dedent(APP.format(broker=REDIS_URL)))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "badapp", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_worker_with_a_bad_setting_exits_at_start_naming_it(tmp_path: Path) -> None:
    done = run_celery(
        tmp_path, "worker", "-P", "solo", "-Q", "test-worker-start-q", "--without-mingle",
        "--without-gossip", "--without-heartbeat",
    )  # fmt: skip
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert "resilience_breakers['dep']['failure_threshold'] must be an integer >= 1" in output
    assert "ready." not in output


def test_the_cli_names_the_bad_setting_without_a_traceback(tmp_path: Path) -> None:
    done = run_celery(tmp_path, "resilience", "status")
    assert done.returncode == 1
    assert done.stderr.startswith("Error: resilience_breakers['dep']['failure_threshold']")
    assert "Traceback" not in done.stderr
