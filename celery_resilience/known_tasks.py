"""What a process knows of its app's tasks: which are registered, once their modules are loaded
as a worker loads them, and the positional parameters of each.

A process that is not a worker (the CLI, a web process, a drain run by hand) has not run
autodiscovery: a task found only that way would look absent there. And a sensitive argument
may be passed by position (``charge.delay(order_id, "4111...")``): the name
``resilience_sensitive_keys`` speaks of comes from the task's signature, read once per task. A
task still unknown has no signature here, and
:class:`~celery_resilience.backout.masking.Masking` masks all of its positional arguments.
"""

from __future__ import annotations

import inspect
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from .backout.masking import Masking, Positions
from .redact import get_logger
from .runtime import Runtime

logger = get_logger("celery_resilience.tasks")
_loaded: weakref.WeakSet[Any] = weakref.WeakSet()
#: When the import of an app's task modules last failed (``time.monotonic()``).
_failed: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
_loading = threading.Lock()
#: Seconds before a failed import of an app's task modules is tried again: each lookup of an
#: unknown task would otherwise import them anew and log the same traceback.
RETRY_IMPORT_AFTER = 60.0
_clock: Callable[[], float] = time.monotonic


def load_task_modules(app: Any) -> None:
    """Import the app's task modules once, as its workers do at start; after a failure, again
    once :data:`RETRY_IMPORT_AFTER` seconds have passed (a module fixed meanwhile)."""
    with _loading:
        if app in _loaded:
            return
        failed_at = _failed.get(app)
        if failed_at is not None and _clock() - failed_at < RETRY_IMPORT_AFTER:
            return
        try:
            app.loader.import_default_modules()
        except Exception:  # a broken task module: its tasks stay unknown, and that is reported
            _failed[app] = _clock()
            logger.exception("Could not import the task modules of app %r", app.main)
            return
        _failed.pop(app, None)
        _loaded.add(app)


def is_registered(app: Any, name: str) -> bool:
    """Whether ``app`` knows the task, after loading its task modules as a worker does."""
    if name not in app.tasks:
        load_task_modules(app)
    return name in app.tasks


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_read: weakref.WeakKeyDictionary[Any, Positions | None] = weakref.WeakKeyDictionary()


def positions_of(task: Any) -> Positions | None:
    """The positional parameters of ``task``'s body, ``None`` if it has no signature to read.

    ``run`` is a bound method for a bound task (``bind=True``) and for a class-based one, so
    their ``self`` is no position; a plain task's ``run`` is the function itself.
    """
    if task in _read:
        return _read[task]
    try:
        parameters = list(inspect.signature(task.run).parameters.values())
    except (TypeError, ValueError):  # a builtin, a callable object without one
        found = None
    else:
        names = tuple(p.name for p in parameters if p.kind in _POSITIONAL)
        rest = next((p.name for p in parameters if p.kind is p.VAR_POSITIONAL), None)
        found = Positions(names, rest)
    _read[task] = found
    return found


def masking_of(runtime: Runtime) -> Masking:
    """How ``runtime``'s app shows its tasks' arguments and errors (its sensitive keys, its
    tasks' signatures, ``resilience_error_text``)."""
    app, config = runtime.app, runtime.config

    def positions(task_name: str) -> Positions | None:
        return positions_of(app.tasks[task_name]) if is_registered(app, task_name) else None

    return Masking(config.sensitive_keys, config.error_text, positions)
