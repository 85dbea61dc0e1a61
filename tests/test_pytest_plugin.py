"""The pytest plugin gives each test an isolated breaker store and back-out store, then cleans up.

Run through ``pytester``: a throwaway test file uses the fixtures as an app's own tests would.
"""

from __future__ import annotations

import pytest
import redis

from tests.support.services import REDIS_URL

pytestmark = pytest.mark.integration

APP_TESTS = """
from celery import Celery

from celery_resilience import Resilience, ResilientTask

app = Celery("plugged", broker="memory://", set_as_current=False)
app.conf.task_always_eager = True
app.conf.resilience_breakers = {{"payments": {{"failure_threshold": 2}}}}


@app.task(base=ResilientTask, breaker="payments", retry_on=(ConnectionError,), max_retries=0)
def charge(order_id):
    raise ConnectionError("gateway down")


def used(harness):  # the key prefix this test was given: the outer test looks for its keys
    with open("{prefix_log}", "a") as log:
        log.write(harness.resilience.runtime.config.key_prefix + "\\n")


def test_parks_and_drains(resilience_factory):
    harness = resilience_factory(app, backend="{backend}", redis_url="{redis_url}")
    used(harness)
    charge.delay(1)
    charge.delay(2)
    assert harness.state("payments") == "open"
    assert sorted(e.args[0] for e in harness.parked(breaker="payments")) == [1, 2]


def test_each_test_starts_clean(resilience_factory):
    harness = resilience_factory(app, backend="{backend}", redis_url="{redis_url}")
    used(harness)
    assert harness.state("payments") == "closed"
    assert harness.parked() == []
    harness.force_open("payments")
    charge.delay(3)
    [entry] = harness.parked(reason="breaker_open")
    assert entry.args == [3]


def test_the_apps_own_resilience_is_back_afterwards():
    assert Resilience.for_app(app).runtime.config.key_prefix == "resilience"
"""


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_fixtures_isolate_each_test_and_clean_up(
    pytester: pytest.Pytester, backend: str, redis_client: redis.Redis
) -> None:
    log = pytester.path / "prefixes.txt"
    tests = APP_TESTS.format(backend=backend, redis_url=REDIS_URL, prefix_log=log)
    pytester.makepyfile(test_app=tests)
    result = pytester.runpytest_subprocess("-q")  # the plugin comes through pytest11
    result.assert_outcomes(passed=3)
    if backend == "memory":  # nothing was written to Redis
        return
    # Each test worked under a fresh prefix of its own and deleted its keys (other tests of this
    # run may be using prefixes of their own on the same database meanwhile).
    prefixes = log.read_text().split()
    assert len(prefixes) == len(set(prefixes)) == 2
    assert all(p.startswith("pytest-") for p in prefixes), prefixes
    for prefix in prefixes:
        assert not list(redis_client.scan_iter(match=f"*{prefix}*")), prefix
