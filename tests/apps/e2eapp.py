"""The Celery app of the end-to-end test: a real ``celery worker`` and ``celery beat`` load it.

Configured from ``E2EAPP_*`` environment variables so a run has a world of its own:

==================  ========================================================================
E2EAPP_PREFIX       key prefix of the breaker, the back-out store, the dependency flag and the
                    ledger; the Redis broker keeps its keys under ``<prefix>:broker:``
E2EAPP_BROKER       broker URL (Redis)
E2EAPP_REDIS        Redis of the breaker, the store, the dependency and the ledger
E2EAPP_QUEUE        the queue of every task of this app (``charge`` and the drain from beat)
E2EAPP_MAX_REPLAYS  ``resilience_max_replays`` (default 5, the package's default)
==================  ========================================================================

The dependency is the flag ``<prefix>:dep:up`` ("1" up, anything else down). Each successful
``charge`` adds its task id to the set ``<prefix>:ledger:succeeded`` and INCRs
``<prefix>:ledger:count:<task id>`` (how often it succeeded: ``deduplicate=True`` says once).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, cast

import redis
from celery import Celery

from celery_resilience import Resilience, ResilientTask
from celery_resilience.backoff import Constant

DEFAULT_REDIS = "redis://127.0.0.1:6379/15"
DRAIN_EVERY = 1.0
BREAKER = {"failure_threshold": 3, "open_timeout": 2.0}

#: One Redis client per process: a prefork child must not reuse its parent's socket.
_clients: dict[int, redis.Redis] = {}


def settings(env: Mapping[str, str]) -> dict[str, str]:
    prefix = env.get("E2EAPP_PREFIX", "e2eapp")
    broker = env.get("E2EAPP_BROKER", DEFAULT_REDIS)
    return {
        "prefix": prefix,
        "broker": broker,
        "redis": env.get("E2EAPP_REDIS", broker),
        "queue": env.get("E2EAPP_QUEUE", f"{prefix}-queue"),
        "max_replays": env.get("E2EAPP_MAX_REPLAYS", "5"),
    }


def keys(prefix: str) -> dict[str, str]:
    """The test's own keys: the dependency flag and the ledger."""
    return {
        "up": f"{prefix}:dep:up",
        "calls": f"{prefix}:dep:calls",
        "succeeded": f"{prefix}:ledger:succeeded",
        "count": f"{prefix}:ledger:count:",
    }


def broker_keyprefix(prefix: str) -> str:
    return f"{prefix}:broker:"


def make_app(env: Mapping[str, str]) -> Celery:
    s = settings(env)
    prefix, url = s["prefix"], s["redis"]
    k = keys(prefix)
    app = Celery(f"e2eapp-{prefix}", set_as_current=False)
    app.conf.update(
        broker_url=s["broker"],
        broker_connection_retry_on_startup=True,
        broker_transport_options={"global_keyprefix": broker_keyprefix(prefix)},
        task_default_queue=s["queue"],
        task_ignore_result=True,
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        # No pidbox: remote control would broadcast to every test's workers on a shared broker.
        worker_enable_remote_control=False,
        worker_hijack_root_logger=True,
        resilience_redis_url=url,
        resilience_key_prefix=prefix,
        resilience_breakers={"dep": dict(BREAKER)},
        resilience_drain_rate=10_000.0,
        resilience_drain_batch=500,
        resilience_max_replays=int(s["max_replays"]),
    )

    def client() -> redis.Redis:
        found = _clients.get(os.getpid())
        if found is None:
            found = _clients[os.getpid()] = redis.Redis.from_url(url)
        return found

    @app.task(
        name="e2eapp.charge",
        base=ResilientTask,
        bind=True,
        shared=False,
        breaker="dep",
        retry_on=(ConnectionError,),
        max_retries=1,
        backoff=Constant(0.2),
        acks_late=True,
        deduplicate=True,
    )
    def charge(self: Any, order_id: int) -> int:
        r = client()
        pipe: Any = r.pipeline()  # redis-py types a command's reply, not the pipeline
        up, _ = pipe.get(k["up"]).incr(k["calls"]).execute()
        if up != b"1":
            raise ConnectionError(f"dependency down (order {order_id})")
        task_id = self.request.id
        cast(Any, r.pipeline()).sadd(k["succeeded"], task_id).incr(k["count"] + task_id).execute()
        return order_id

    app.conf.beat_schedule = {"drain": Resilience.for_app(app).beat_schedule(every=DRAIN_EVERY)}
    return app


app = make_app(os.environ)
