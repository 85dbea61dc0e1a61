"""Sending a parked entry again: the checks a worker would make, then the publish itself."""

from __future__ import annotations

import logging
import threading
import weakref
from typing import TYPE_CHECKING, Any

from .backout.entry import ParkedTask
from .parking import REPLAYS_HEADER

if TYPE_CHECKING:
    from .resilience import Resilience

logger = logging.getLogger("celery_resilience.drain")


def publish(resilience: Resilience, entry: ParkedTask, producer: Any = None) -> None:
    """Send ``entry`` again with its task id and options; ``KeyError`` if not registered."""
    task = resilience.app.tasks[entry.task_name]
    options = dict(entry.options)
    headers = dict(options.pop("headers", None) or {})
    headers[REPLAYS_HEADER] = entry.replays + 1
    task.apply_async(
        entry.args,
        entry.kwargs,
        task_id=entry.task_id,
        headers=headers,
        producer=producer,
        **options,
    )


_loaded: weakref.WeakSet[Any] = weakref.WeakSet()
_loading = threading.Lock()


def load_task_modules(app: Any) -> None:
    """Import the app's task modules once, as its workers do at start (again after a failure).

    A process that is not a worker (the CLI, a web process) has not run autodiscovery: a task
    found only that way would look unregistered there.
    """
    with _loading:
        if app in _loaded:
            return
        try:
            app.loader.import_default_modules()
        except Exception:  # a broken task module: its tasks stay unknown, and that is reported
            logger.exception("Could not import the task modules of app %r", app.main)
            return
        _loaded.add(app)


def is_registered(app: Any, name: str) -> bool:
    """Whether ``app`` knows the task, after loading its task modules as a worker does."""
    if name not in app.tasks:
        load_task_modules(app)
    return name in app.tasks


def check_arguments(resilience: Resilience, entry: ParkedTask) -> None:
    """Celery's own check of args against the task's signature (``TypeError`` if they don't fit)."""
    task = resilience.app.tasks[entry.task_name]
    header = getattr(task, "__header__", None)
    if header is not None and getattr(task, "typing", True):
        header(*entry.args, **entry.kwargs)
