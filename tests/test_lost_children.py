"""A pool that loses many children at once (the OOM killer) while Redis does not answer costs
the worker's main process one Redis wait, not one per child: what the dead children held (a
claim on their task ids, a permit's lease) is left to the leases for a while after Redis failed
to answer once. With Redis up, each child's claim is given back at once.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.app.task import Context

from celery_resilience import Resilience, ResilientTask
from celery_resilience.delivery import time_limits
from celery_resilience.headers import DELIVERY_HEADER
from celery_resilience.runtime import Runtime, forget
from tests.support.redis_server import free_port

pytestmark = pytest.mark.integration

CHILDREN = 8


def make_app(redis_url: str, key_prefix: str, timeout: float = 0.2) -> Celery:
    app = Celery("lost-children", set_as_current=False)
    app.conf.update(
        resilience_redis_url=redis_url,
        resilience_key_prefix=key_prefix,
        resilience_redis_timeout=timeout,
        resilience_breakers={"dep": {"failure_threshold": 3}},
    )

    @app.task(name="lost.charge", base=ResilientTask, bind=True, breaker="dep", shared=False)
    def charge(self: Any) -> None: ...

    app.tasks["lost.charge"].deduplicate = True
    return app


def lose_children(runtime: Runtime, app: Celery) -> list[tuple[Any, ...]]:
    """``CHILDREN`` deliveries whose pool children died; the claims the main process tried to
    give back."""
    asked: list[tuple[Any, ...]] = []
    guard = runtime.guard
    unclaim = guard.unclaim

    def spy(*args: Any) -> bool:
        asked.append(args)
        return unclaim(*args)

    guard.unclaim = spy  # type: ignore[method-assign,assignment]
    task = app.tasks["lost.charge"]
    for _ in range(CHILDREN):
        request = Context(id=uuid.uuid4().hex, **{DELIVERY_HEADER: uuid.uuid4().hex})
        time_limits.lost(task._delivery(request))
    return asked


@pytest.fixture
def down(key_prefix: str) -> Iterator[tuple[Runtime, Celery]]:
    app = make_app(f"redis://127.0.0.1:{free_port()}/0", key_prefix)  # nothing listens
    yield Resilience.for_app(app).runtime, app
    forget(app)


def test_children_lost_in_a_redis_outage_cost_the_main_process_one_wait(
    down: tuple[Runtime, Celery],
) -> None:
    runtime, app = down
    assert len(lose_children(runtime, app)) == 1


def test_children_lost_with_redis_up_give_their_claims_back_at_once(
    redis_url: str, key_prefix: str
) -> None:
    # Seconds to answer: one late answer of a loaded Redis would pause the freeing.
    app = make_app(redis_url, key_prefix, timeout=2.0)
    try:
        runtime = Resilience.for_app(app).runtime
        assert len(lose_children(runtime, app)) == CHILDREN
    finally:
        forget(app)
