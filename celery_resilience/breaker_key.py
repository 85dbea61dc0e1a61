"""Which breaker one delivery calls through: the task's ``breaker``, or with ``breaker_key`` the
breaker derived from it for this delivery's arguments (``<breaker>:<key>``, named at call time).

``breaker_key`` is a template formatted with the arguments bound to the task's signature
(``"{host}"``), or a callable given the task's arguments that returns the key. A key that can't
be derived (a missing argument, a bug in the callable, an unusable key) is the task's bug, not
the dependency's: the delivery goes through the declared breaker instead, with an ERROR line,
so that it is guarded and nothing is lost.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from .config import derived_name
from .redact import get_logger

logger = get_logger("celery_resilience.task")
#: Where the name is kept on the request: derived once per delivery.
_ATTRIBUTE = "resilience_breaker"

KeyOption = str | Callable[..., Any] | None


def breaker_of(task: Any, request: Any) -> str | None:
    """The name of the breaker this delivery of ``task`` calls through."""
    if task.breaker is None or task.breaker_key is None:
        return task.breaker  # type: ignore[no-any-return]
    name = getattr(request, _ATTRIBUTE, None)
    if name is None:
        name = _derive(task, request.args or (), request.kwargs or {})
        setattr(request, _ATTRIBUTE, name)
    return name


def _derive(task: Any, args: Any, kwargs: Any) -> str:
    option = task.breaker_key
    try:
        if callable(option):
            key = option(*args, **kwargs)
        else:
            bound = inspect.signature(task.run).bind_partial(*args, **kwargs)
            key = str(option).format(**bound.arguments)
        return derived_name(task.runtime.config.breakers, task.breaker, str(key))
    except Exception as exc:
        logger.error(
            "Could not derive the breaker of %s from its arguments (%r); it calls through %r",
            task.name,
            exc,
            task.breaker,
        )
        return task.breaker  # type: ignore[no-any-return]
