"""A dedup key from a delivery's arguments: ``deduplicate="order:{order_id}"`` or a callable.

The template is formatted with the arguments bound to the task's signature, as ``breaker_key``'s
is (``argument_key.py``: an argument left out renders as its default, a ``**kwargs`` body's
fields name the keywords it is given); a callable is given the task's arguments and returns the
key. The key is the task's name and the rendered text (``<task name>:<key>``): two tasks that
render the same text do not hold each other up, as in celery-once and celery-singleton. The
task's registration checks a template's fields against the body's parameters (:func:`check`): a
field naming no argument fails there, naming the task and the option. A key that still can't be
rendered for a delivery (a field naming a keyword not given, a key of nothing, a bug in the
callable) is the task's bug: the delivery is deduplicated by its task id instead, with an ERROR
line, so that it is still guarded. A key of nothing (a field whose value is ``None``, a callable
returning ``None`` or ``""``) is refused rather than rendered: it would be one key for every
such delivery, each skipped once the first succeeded.
"""

from __future__ import annotations

import inspect
import re
import string
from collections.abc import Callable
from typing import Any

from ..config.values import invalid
from ..redact import get_logger
from .argument_key import render
from .context import Delivery

logger = get_logger("celery_resilience.task")
#: Where the key is kept on the request: rendered once per delivery.
_ATTRIBUTE = "resilience_dedup_key"
_EXPECTED = "True, a template of the task's arguments such as 'order:{order_id}', or a callable"


def check(owner: str, value: Any, run: Callable[..., Any]) -> None:
    """``deduplicate`` of task ``owner``: ``True``/``False``, a callable, or a template whose
    every field names a parameter of ``run`` (the task's body)."""
    option = f"{owner}.deduplicate"
    if isinstance(value, bool) or callable(value):
        return
    if not isinstance(value, str):
        raise invalid(option, value, _EXPECTED)
    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(value) if name is not None]
    except ValueError as exc:
        raise invalid(option, value, f"a str.format template ({exc})") from exc
    if not fields:
        raise invalid(option, value, "a template naming an argument (else one key for all)")
    params = inspect.signature(run).parameters
    any_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for field in fields:
        argument = re.split(r"[.\[]", field, maxsplit=1)[0]
        if not argument or argument.isdigit():
            raise invalid(option, value, "a template whose fields name arguments, not positions")
        if argument not in params and not any_keyword:
            takes = ", ".join(p for p in params if p != "self") or "none"
            raise invalid(
                option,
                value,
                f"a template of the task's arguments ({takes}); {argument!r} is not one",
            )


def key_of(delivery: Delivery) -> str:
    """``delivery``'s dedup key (``<task name>:<rendered>``), ``""`` without one (the task id is
    claimed)."""
    option = delivery.options.dedup_key
    if option is None:
        return ""
    request = delivery.request
    key: str | None = getattr(request, _ATTRIBUTE, None)
    if key is None:
        key = _render(delivery, option, request.args or (), request.kwargs or {})
        setattr(request, _ATTRIBUTE, key)
    return key


def _render(delivery: Delivery, option: Any, args: Any, kwargs: Any) -> str:
    name = delivery.task.name
    try:
        return f"{name}:{render(delivery.task.run, option, args, kwargs)}"
    except Exception as exc:
        logger.error(
            "Could not render the dedup key of %s[%s] from its arguments (%r): its task id is "
            "deduplicated instead",
            name,
            delivery.request.id,
            exc,
        )
        return ""
