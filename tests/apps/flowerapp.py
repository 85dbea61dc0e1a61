"""The Celery app that the ``celery worker`` and ``celery flower`` subprocesses of
``tests/test_flower.py`` load.

It is ``tests/apps/workerapp.py``'s world (everything from ``WORKERAPP_*`` environment
variables: key prefix, queue, breaker ``dep`` and the Redis-flag dependency of
``workerapp.charge``), with task events switched on, as ``celery worker -E`` would: Flower builds
its task states from events only.
Remote control stays off (a shared broker), so Flower's periodic ``enable_events`` broadcast
reaches nobody and the setting below is what makes the worker send them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from celery import Celery

from tests.apps.workerapp import make_app as make_worker_app


def make_app(env: Mapping[str, str]) -> Celery:
    app = make_worker_app(env)
    app.conf.update(worker_send_task_events=True, task_send_sent_event=True)
    return app


app = make_app(os.environ)
