"""A key from a delivery's arguments, as ``breaker_key`` and ``deduplicate`` take one: a
``str.format`` template (``"order:{order_id}"``) or a callable given the task's arguments.

A template is formatted with the arguments bound to the task's body: an argument left out
renders as its default (as the body would run), and a ``**kwargs`` body's fields name the
keywords it is given. A key of nothing is refused (``ValueError``) rather than rendered: a field
whose value is ``None``, a callable returning ``None`` or ``""``. ``"order:None"`` would be one
key for every delivery without an order.
"""

from __future__ import annotations

import inspect
import string
from collections.abc import Callable
from typing import Any


def render(run: Callable[..., Any], option: Any, args: Any, kwargs: Any) -> str:
    """``option`` (a template or a callable) for ``run(*args, **kwargs)``; raises what goes
    wrong (a missing argument, a bug in the callable, a key of nothing)."""
    if callable(option):
        rendered = option(*args, **kwargs)
        if rendered is None:
            raise ValueError("the callable returned None")
    else:
        rendered = _KeyFormatter().vformat(str(option), (), _fields(run, args, kwargs))
    text = str(rendered)
    if text == "":
        raise ValueError("the key is empty")
    return text


def _fields(run: Callable[..., Any], args: Any, kwargs: Any) -> dict[str, Any]:
    """What a template's fields name: the arguments bound to ``run``, its defaults filled in,
    and the keywords a ``**kwargs`` parameter gathers by their own names."""
    signature = inspect.signature(run)
    bound = signature.bind_partial(*args, **kwargs)
    bound.apply_defaults()
    fields = dict(bound.arguments)
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            fields.update(fields.pop(parameter.name, {}))
    return fields


class _KeyFormatter(string.Formatter):
    """``str.format`` that refuses a field whose value is ``None``."""

    def format_field(self, value: Any, format_spec: str) -> Any:
        if value is None:
            raise ValueError("a field of the template is None")
        return super().format_field(value, format_spec)
