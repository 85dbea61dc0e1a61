"""The pytest plugin gives each test an isolated breaker store and back-out store, then cleans up.

Run through ``pytester``: a throwaway test file uses the fixtures as an app's own tests would.
"""

from __future__ import annotations

import pytest
import redis

from tests.conftest import REDIS_URL

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


PREFIXES = []


def test_parks_and_drains(resilience_factory):
    harness = resilience_factory(app, backend="{backend}", redis_url="{redis_url}")
    charge.delay(1)
    charge.delay(2)
    assert harness.state("payments") == "open"
    assert sorted(e.args[0] for e in harness.parked(breaker="payments")) == [1, 2]
    PREFIXES.append(harness.resilience.runtime.config.key_prefix)


def test_each_test_starts_clean(resilience_factory):
    harness = resilience_factory(app, backend="{backend}", redis_url="{redis_url}")
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
    pytester.makepyfile(test_app=APP_TESTS.format(backend=backend, redis_url=REDIS_URL))
    result = pytester.runpytest_subprocess("-q")  # the plugin comes through pytest11
    result.assert_outcomes(passed=3)
    # The redis backend worked under a fresh prefix per test and deleted its keys.
    assert not list(redis_client.scan_iter(match="*pytest-*"))
