"""Signals: ``task_parked`` for apps, and the package's own worker signal handlers.

The handlers give every pool child fresh connections, flush deferred records at shutdown and run
the start-up checks. They are module-level functions connected with a ``dispatch_uid``: Celery's
signals hold weak references, so a handler defined inside a function would never fire.
"""

from __future__ import annotations

from typing import Any

from celery.signals import (
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)
from celery.utils.dispatch import Signal

from .redact import get_logger

logger = get_logger("celery_resilience")

#: Sent after a task was parked: ``sender`` is the task, with ``entry`` (the ParkedTask) and
#: ``request``. Handlers run in the worker, after the entry is stored, before the message is
#: acked; an exception in a handler is logged and changes nothing.
task_parked = Signal(name="task_parked", providing_args={"entry", "request"})


def all_instances() -> list[Any]:
    from .resilience import all_instances

    return all_instances()


def _reconnect(**_: Any) -> None:
    # A prefork child must not use a socket opened by the parent before the fork.
    for resilience in all_instances():
        resilience.reset_connections()


def _flush(**_: Any) -> None:
    for resilience in all_instances():
        resilience.flush()


def _check(sender: Any = None, **_: Any) -> None:
    from .checks import log_findings, run_checks
    from .resilience import Resilience

    app = getattr(sender, "app", None)
    if app is not None:
        log_findings(run_checks(Resilience.for_app(app)))


def _validate(sender: Any = None, **_: Any) -> None:
    """Bad settings stop the worker at start, with the setting's name, not at the first task."""
    from .errors import ConfigurationError
    from .resilience import Resilience

    app = getattr(sender, "app", None)
    if app is None:
        return
    try:
        Resilience.for_app(app)
    except ConfigurationError as exc:
        logger.critical("celery-resilience: %s", exc)
        # SystemExit passes through Celery's signal dispatch (it catches Exception only).
        raise SystemExit(f"celery-resilience: {exc}") from exc


def connect() -> None:
    """Connect the handlers (idempotent; done when ``celery_resilience.task`` is imported)."""
    worker_process_init.connect(_reconnect, dispatch_uid="celery_resilience.reconnect")
    worker_process_shutdown.connect(_flush, dispatch_uid="celery_resilience.flush_child")
    worker_shutdown.connect(_flush, dispatch_uid="celery_resilience.flush")
    worker_ready.connect(_check, dispatch_uid="celery_resilience.check")
    worker_init.connect(_validate, dispatch_uid="celery_resilience.validate")
