"""The worker's lifecycle, as the package takes part in it: every handler of Celery's worker
signals, connected in one place by :func:`connect`.

Like Celery's own Django fixup, the handlers are installed once and act on every app's runtime:
bad settings stop the worker at start (with the setting's name, not at the first task), the
start-up checks are logged when it is ready, every pool child gets fresh connections, and
deferred breaker records are flushed at shutdown. They are module-level functions connected with
a ``dispatch_uid``: Celery's signals hold weak references, so a handler defined inside a
function would never fire.
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

from . import remote  # noqa: F401  (registers the remote control command workers answer)
from .checks import log_findings, run_checks
from .config.limits import WorkerLimits
from .errors import ConfigurationError
from .redact import get_logger
from .runtime import Runtime, all_runtimes
from .task import resilient_tasks

logger = get_logger("celery_resilience")


def connect() -> None:
    """Connect the package's worker signal handlers (idempotent)."""
    worker_init.connect(_validate, dispatch_uid="celery_resilience.validate")
    worker_ready.connect(_check, dispatch_uid="celery_resilience.check")
    worker_process_init.connect(_reconnect, dispatch_uid="celery_resilience.reconnect")
    worker_process_shutdown.connect(_flush, dispatch_uid="celery_resilience.flush_child")
    worker_shutdown.connect(_flush, dispatch_uid="celery_resilience.flush")


def _validate(sender: Any = None, **_: Any) -> None:
    """Bad settings stop the worker at start, with the setting's name, not at the first task.
    The worker's own time limits (its command line) are kept for its tasks: its pool's
    children, forked after this, inherit them."""
    app = getattr(sender, "app", None)
    if app is None:
        return
    try:
        runtime = Runtime.for_app(app)
    except ConfigurationError as exc:
        logger.critical("celery-resilience: %s", exc)
        # SystemExit passes through Celery's signal dispatch (it catches Exception only).
        raise SystemExit(f"celery-resilience: {exc}") from exc
    runtime.worker = WorkerLimits.of(sender)


def _check(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if app is not None:
        runtime = Runtime.for_app(app)
        _report_version(runtime, getattr(sender, "hostname", None) or "worker")
        log_findings(run_checks(runtime, resilient_tasks(app)))


def _report_version(runtime: Runtime, hostname: str) -> None:
    """Say in Redis which version this worker runs (``celery resilience fleet`` shows it)."""
    try:
        runtime.fleet.report(hostname)
    except Exception:  # a report must never stop a worker: Redis may be away at start
        logger.warning("Could not report this worker's version to Redis", exc_info=True)


def _reconnect(**_: Any) -> None:
    # A prefork child must not use a socket opened by the parent before the fork.
    for runtime in all_runtimes():
        runtime.reset_connections()


def _flush(**_: Any) -> None:
    for runtime in all_runtimes():
        runtime.flush()
