"""Worker signal handlers: fresh connections in every pool child, deferred records flushed.

Module-level functions connected with a ``dispatch_uid``: Celery's signals hold weak references,
so a handler defined inside a function would be collected and never fire.
"""

from __future__ import annotations

from typing import Any

from celery.signals import (
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)

from .checks import log_findings, run_checks
from .resilience import Resilience, all_instances


def _reconnect(**_: Any) -> None:
    # A prefork child must not use a socket opened by the parent before the fork.
    for resilience in all_instances():
        resilience.reset_connections()


def _flush(**_: Any) -> None:
    for resilience in all_instances():
        resilience.flush()


def _check(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if app is not None:
        log_findings(run_checks(Resilience.for_app(app)))


def connect() -> None:
    """Connect the handlers (idempotent; done when ``celery_resilience.task`` is imported)."""
    worker_process_init.connect(_reconnect, dispatch_uid="celery_resilience.reconnect")
    worker_process_shutdown.connect(_flush, dispatch_uid="celery_resilience.flush_child")
    worker_shutdown.connect(_flush, dispatch_uid="celery_resilience.flush")
    worker_ready.connect(_check, dispatch_uid="celery_resilience.check")
