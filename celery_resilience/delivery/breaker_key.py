"""Which breaker one delivery calls through: the task's ``breaker``, or with ``breaker_key`` the
breaker derived from it for this delivery's arguments (``<breaker>:<key>``, named at call time).

``breaker_key`` is a template formatted with the arguments bound to the task's signature
(``"{host}"``), or a callable given the task's arguments that returns the key
(``argument_key.py``, as ``deduplicate`` takes its key). A key that can't be derived (a missing
argument, a bug in the callable, a key of nothing, an unusable key) is the task's bug, not
the dependency's: the delivery goes through the declared breaker instead, with an ERROR line,
so that it is guarded and nothing is lost.
"""

from __future__ import annotations

from typing import Any

from ..config import derived_name
from ..redact import get_logger
from .argument_key import render
from .context import Delivery

logger = get_logger("celery_resilience.task")
#: Where the name is kept on the request: derived once per delivery.
_ATTRIBUTE = "resilience_breaker"


def breaker_of(delivery: Delivery) -> str | None:
    """The name of the breaker ``delivery`` calls through."""
    options = delivery.options
    if options.breaker is None or options.breaker_key is None:
        return options.breaker
    request = delivery.request
    name: str | None = getattr(request, _ATTRIBUTE, None)
    if name is None:
        name = _derive(delivery, options.breaker, request.args or (), request.kwargs or {})
        setattr(request, _ATTRIBUTE, name)
    return name


def _derive(delivery: Delivery, base: str, args: Any, kwargs: Any) -> str:
    option = delivery.options.breaker_key
    try:
        key = render(delivery.task.run, option, args, kwargs)
        return derived_name(delivery.runtime.config.breakers, base, key)
    except Exception as exc:
        logger.error(
            "Could not derive the breaker of %s from its arguments (%r); it calls through %r",
            delivery.task.name,
            exc,
            base,
        )
        return base
