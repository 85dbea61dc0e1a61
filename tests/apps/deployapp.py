"""The app of the Sentinel and Cluster tests: ``tests.apps.workerapp`` (read it: ``WORKERAPP_*``)
with what a deployment beyond one Redis adds, from ``DEPLOYAPP_*`` environment variables:

========================  ==================================================================
DEPLOYAPP_REDIS_OPTIONS   JSON of ``resilience_redis_options`` (``master_name`` for Sentinel)
DEPLOYAPP_PARK_REPLICAS   ``resilience_park_replicas``
DEPLOYAPP_SECOND_BREAKER  a second breaker, called by ``deployapp.lookup`` through a
                          dependency of its own (``<P>:<name>:dep:up``, see ``workerapp``)
========================  ==================================================================

``WORKERAPP_REDIS`` is the deployment's URL (``sentinel://...``, ``redis+cluster://...``);
the broker and the ledger (``WORKERAPP_LEDGER``) stay on the plain Redis of the suite. Workers
run ``celery -A tests.apps.deployapp worker``, the CLI
``celery -A tests.apps.deployapp resilience``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from celery import Celery

from celery_resilience import ResilientTask
from celery_resilience.backoff import Exponential
from tests.apps import workerapp


def make_app(env: Mapping[str, str]) -> Celery:
    app = workerapp.make_app(env)
    app.conf.resilience_redis_options = json.loads(env.get("DEPLOYAPP_REDIS_OPTIONS", "{}"))
    app.conf.resilience_park_replicas = int(env.get("DEPLOYAPP_PARK_REPLICAS", "0"))
    second = env.get("DEPLOYAPP_SECOND_BREAKER")
    if second:
        s = workerapp.settings(env)
        app.conf.resilience_breakers = {
            **app.conf.resilience_breakers,
            second: {
                "failure_threshold": s["failure_threshold"],
                "open_timeout": s["open_timeout"],
            },
        }
        define_lookup(app, s, second)
    return app


def define_lookup(app: Celery, s: Mapping[str, Any], breaker: str) -> None:
    prefix, url = s["prefix"], s["ledger"]

    @app.task(
        name="deployapp.lookup",
        base=ResilientTask,
        bind=True,
        shared=False,
        acks_late=True,
        reject_on_worker_lost=True,
        breaker=breaker,
        retry_on=(ConnectionError,),
        max_retries=s["max_retries"],
        backoff=Exponential(base=s["backoff_base"], cap=s["backoff_cap"], jitter=s["jitter"]),
    )
    def lookup(self: Any, order_id: str) -> str:
        r = workerapp.client(url)
        workerapp.call_dependency(r, f"{prefix}:{breaker}", self, order_id)
        with r.pipeline() as pipe:
            pipe.sadd(f"{prefix}:ledger:succeeded", self.request.id)
            pipe.hincrby(f"{prefix}:ledger:runs", self.request.id, 1)
            pipe.execute()
        return order_id


app = make_app(os.environ)
