"""The Celery app that ``celery -A tests.apps.cliapp resilience ...`` subprocesses load.

Everything comes from ``CLIAPP_*`` environment variables, so each test has a world of its own:

=================  =========================================================================
CLIAPP_PREFIX      key prefix of the breakers and the back-out store; the Redis broker keeps
                   its keys under ``<prefix>:broker:`` (kombu's ``global_keyprefix``)
CLIAPP_BROKER      broker URL (Redis); also the resilience Redis unless CLIAPP_REDIS is set
CLIAPP_REDIS       Redis of the breakers and the back-out store
CLIAPP_QUEUE       the app's default queue (nobody consumes it: tests read the broker list)
CLIAPP_KEYS        optional JSON: ``{"signing": [...], "encryption": [...]}``, the store's keys
CLIAPP_ACKS_LATE   "1": the tasks are acked late and requeued on a lost worker (default: not)
CLIAPP_HOOKS       a number: declare ``hook`` too, a breaker per host (``cliapp.send``, with
                   ``breaker_key="{host}"``), and show that many of its derived breakers
CLIAPP_CONF        optional JSON: more settings, applied last (``{"resilience_drain_rate": 0}``)
=================  =========================================================================

The test process builds the same app with :func:`make_app` from the same mapping. Two
configured breakers, ``payments`` and ``search``, and one task for each (plus one without a
breaker). Nothing here runs a task: the CLI only parks, lists, replays and steers.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from celery import Celery

from celery_resilience import ResilientTask

DEFAULT_REDIS = "redis://127.0.0.1:6379/15"
BREAKERS = ("payments", "search")
#: Long enough that a test's commands on a busy host still find a tripped breaker open.
OPEN_TIMEOUT = 600.0
BREAKER = {"failure_threshold": 3, "open_timeout": OPEN_TIMEOUT}


def settings(env: Mapping[str, str]) -> dict[str, str]:
    prefix = env.get("CLIAPP_PREFIX", "cliapp")
    broker = env.get("CLIAPP_BROKER", DEFAULT_REDIS)
    return {
        "prefix": prefix,
        "broker": broker,
        "redis": env.get("CLIAPP_REDIS", broker),
        "queue": env.get("CLIAPP_QUEUE", f"{prefix}-queue"),
        "keys": env.get("CLIAPP_KEYS", "{}"),
        "acks_late": env.get("CLIAPP_ACKS_LATE", ""),
        "hooks": env.get("CLIAPP_HOOKS", ""),
        "conf": env.get("CLIAPP_CONF", "{}"),
    }


def broker_keyprefix(prefix: str) -> str:
    """Where the Redis broker keeps its keys (queue lists, bindings) for this prefix."""
    return f"{prefix}:broker:"


def make_app(env: Mapping[str, str]) -> Celery:
    s = settings(env)
    app = Celery(f"cliapp-{s['prefix']}", set_as_current=False)
    app.conf.update(
        broker_url=s["broker"],
        broker_connection_retry_on_startup=True,
        broker_transport_options={"global_keyprefix": broker_keyprefix(s["prefix"])},
        task_default_queue=s["queue"],
        task_ignore_result=True,
        worker_enable_remote_control=False,
        resilience_redis_url=s["redis"],
        resilience_key_prefix=s["prefix"],
        resilience_breakers={
            name: {"failure_threshold": 3, "open_timeout": OPEN_TIMEOUT} for name in BREAKERS
        },
        resilience_drain_rate=10_000.0,
        resilience_drain_batch=100,
        resilience_sensitive_keys=["card_token"],
        task_acks_late=s["acks_late"] == "1",
        task_reject_on_worker_lost=s["acks_late"] == "1",
    )
    if s["hooks"]:
        app.conf.resilience_breakers = {**app.conf.resilience_breakers, "hook": BREAKER}
        app.conf.resilience_derived_shown = int(s["hooks"])
    keys = json.loads(s["keys"])
    app.conf.resilience_signing_key = keys.get("signing")
    app.conf.resilience_encryption_key = keys.get("encryption")
    app.conf.update(json.loads(s["conf"]))
    resilient = {"base": ResilientTask, "bind": True, "shared": False}

    @app.task(name="cliapp.charge", breaker="payments", retry_on=(ConnectionError,), **resilient)
    def charge(
        self: Any, order_id: str, amount: int = 1, note: str = "", currency: str = "EUR"
    ) -> None:
        return None

    @app.task(name="cliapp.lookup", breaker="search", retry_on=(ConnectionError,), **resilient)
    def lookup(self: Any, *args: Any, **kwargs: Any) -> None:
        return None

    if s["hooks"]:

        @app.task(name="cliapp.send", breaker="hook", breaker_key="{host}", **resilient)
        def send(self: Any, host: str, payload: Any = None) -> None:
            return None

    @app.task(name="cliapp.notify", **resilient)
    def notify(self: Any, *args: Any, **kwargs: Any) -> None:
        return None

    return app


app = make_app(os.environ)
