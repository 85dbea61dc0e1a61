"""A process that is not a worker (CLI, web) loads the app's task modules before judging an entry.

Without it, a task found only by autodiscovery or ``imports`` would look unregistered there: a
replay would be refused and a drain would declare the entry dead.
"""

from __future__ import annotations

import sys
import uuid

import redis
from celery import Celery

from celery_resilience import ParkedTask, Resilience


def test_replay_loads_the_apps_task_modules_first(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    sys.modules.pop("tests.lazy_tasks", None)
    app = Celery("lazy", broker=redis_url, set_as_current=False)
    app.conf.imports = ("tests.lazy_tasks",)
    app.conf.resilience_key_prefix = key_prefix
    queue = f"{key_prefix}-queue"
    resilience = Resilience(app)
    assert "lazy.charge" not in app.tasks
    entry = ParkedTask.new(
        task_name="lazy.charge",
        task_id=str(uuid.uuid4()),
        reason="breaker_open",
        args=[7],
        options={"queue": queue},
    )
    resilience.backout_store.park(entry)
    try:
        resilience.backout.replay(entry.id)
        assert redis_client.llen(queue) == 1
        assert resilience.backout.count() == 0
    finally:
        redis_client.delete(queue)
