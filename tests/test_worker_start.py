"""A bad setting stops a real worker at start, naming the setting; nothing runs half-configured."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.services import REDIS_URL

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = """
from celery import Celery
from celery_resilience import ResilientTask

app = Celery("badapp", broker={broker!r})
app.conf.resilience_key_prefix = "test-worker-start"
{bad}


@app.task(base=ResilientTask, breaker="dep")
def charge(order_id):
    return order_id
"""


#: A bad setting -> what the error says about it.
BAD = {
    'app.conf.resilience_breakers = {"dep": {"failure_threshold": -1}}': (
        "resilience_breakers['dep']['failure_threshold'] must be an integer >= 1"
    ),
    # Accepted by the store's own check only when it first parked, in 0.1.0: every task failed.
    'app.conf.resilience_serializer = "yaml"': (
        "resilience_serializer must be one of 'json', 'msgpack', 'pickle', got 'yaml'"
    ),
    'app.conf.resilience_backout_store = "no.such.module.make_store"': (
        "resilience_backout_store must be 'redis', 'django' or the dotted path of an "
        "importable factory, got 'no.such.module.make_store'"
    ),
    # The message names the URL with its password masked.
    'app.conf.resilience_redis_url = "redis://:s3cret@127.0.0.1:notaport/0"': (
        "resilience_redis_url must be a redis:// URL, got 'redis://:***@127.0.0.1:notaport/0'"
    ),
}
FIRST = next(iter(BAD))


CHECKOUT = Path(__file__).resolve().parent.parent


def run_celery(tmp_path: Path, *args: str, bad: str = FIRST) -> subprocess.CompletedProcess[str]:
    (tmp_path / "badapp.py").write_text(textwrap.dedent(APP.format(broker=REDIS_URL, bad=bad)))
    # The checkout after the app's directory: the code under test, not an installed copy.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(CHECKOUT)])}
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "badapp", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("bad", list(BAD))
def test_a_worker_with_a_bad_setting_exits_at_start_naming_it(tmp_path: Path, bad: str) -> None:
    done = run_celery(
        tmp_path, "worker", "-P", "solo", "-Q", "test-worker-start-q", "--without-mingle",
        "--without-gossip", "--without-heartbeat", bad=bad,
    )  # fmt: skip
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert BAD[bad] in output
    assert "ready." not in output
    assert "s3cret" not in output


@pytest.mark.parametrize("bad", list(BAD))
def test_the_cli_names_the_bad_setting_without_a_traceback(tmp_path: Path, bad: str) -> None:
    done = run_celery(tmp_path, "resilience", "status", bad=bad)
    assert done.returncode == 1
    assert done.stderr.startswith(f"Error: {BAD[bad]}")
    assert "Traceback" not in done.stderr
    assert "s3cret" not in done.stdout + done.stderr
