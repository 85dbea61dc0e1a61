"""Sending a parked entry again: the checks a worker would make, then the publish itself."""

from __future__ import annotations

import logging
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


_imported: set[int] = set()


def is_registered(app: Any, name: str) -> bool:
    """Whether ``app`` knows the task, after loading its task modules as a worker does.

    A process that is not a worker (the CLI, a web process) has not run autodiscovery: a task
    found only that way would look unregistered, and its entry would be declared dead.
    """
    if name in app.tasks:
        return True
    if id(app) not in _imported:
        _imported.add(id(app))
        try:
            app.loader.import_default_modules()
        except Exception:  # a broken task module: its tasks stay unknown, and that is reported
            logger.exception("Could not import the task modules of app %r", app.main)
    return name in app.tasks


def check_arguments(resilience: Resilience, entry: ParkedTask) -> None:
    """Celery's own check of args against the task's signature (``TypeError`` if they don't fit)."""
    task = resilience.app.tasks[entry.task_name]
    header = getattr(task, "__header__", None)
    if header is not None and getattr(task, "typing", True):
        header(*entry.args, **entry.kwargs)
