"""A short, masked summary of a parked task's arguments, for people: admin, CLI, logs, events.

Parked tasks hold customer data, and the surfaces that list them are read by more people than
the code that wrote them. So what a person sees goes through one function: Celery's own
``argsrepr``/``kwargsrepr`` when the caller set them (``apply_async(argsrepr=...)`` is how an app
already hides arguments from Flower and the logs), else the arguments with the value of every
key named in ``resilience_sensitive_keys`` (at any depth) replaced by a mask, cut to a width.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from .entry import ParkedTask

#: What a sensitive value reads as.
MASK = "***"
#: What the arguments of an entry read without its encryption key show.
SEALED = "<encrypted>"
#: Default width of a summary (characters), an ellipsis included.
WIDTH = 80
#: Stands for every key: what a page masks when it cannot read the app's sensitive keys
#: (a bad setting, no usable app), masking more rather than showing a secret.
EVERY_KEY = ("*",)


def masked(value: Any, sensitive: Collection[str]) -> Any:
    """``value`` with every mapping's ``sensitive`` keys (case-insensitive) masked, at any
    depth of mappings, lists and tuples."""
    if not sensitive:
        return value
    names = {name.lower() for name in sensitive}
    return _masked(value, names)


def _masked(value: Any, names: set[str]) -> Any:
    if isinstance(value, Mapping):
        every = "*" in names
        return {
            key: MASK
            if isinstance(key, str) and (every or key.lower() in names)
            else _masked(item, names)
            for key, item in value.items()
        }
    if isinstance(value, (list, tuple)):
        return type(value)(_masked(item, names) for item in value)
    return value


def arguments(entry: ParkedTask, sensitive: Collection[str] = ()) -> str:
    """The whole call as a person may see it: ``1, 'a', order_id=15, card_token='***'``."""
    if entry.encrypted:
        return SEALED
    options = entry.options
    return call(
        entry.args, entry.kwargs, options.get("argsrepr"), options.get("kwargsrepr"), sensitive
    )


def call(
    args: Any, kwargs: Any, argsrepr: Any, kwargsrepr: Any, sensitive: Collection[str] = ()
) -> str:
    """``args`` and ``kwargs`` as :func:`arguments` shows them (a task's request has them
    apart: the log line of a task that could not be parked)."""
    if isinstance(argsrepr, str):
        shown_args = _inner(argsrepr, "()", "[]")
    else:
        shown_args = ", ".join(repr(a) for a in masked(list(args or ()), sensitive))
    if isinstance(kwargsrepr, str):  # a dict literal: shown as the call would spread it
        inner = _inner(kwargsrepr, "{}")
        shown_kwargs = f"**{{{inner}}}" if inner else ""
    else:
        shown = masked(dict(kwargs or {}), sensitive)
        shown_kwargs = ", ".join(f"{key}={value!r}" for key, value in shown.items())
    return ", ".join(part for part in (shown_args, shown_kwargs) if part)


def summary(entry: ParkedTask, sensitive: Collection[str] = (), width: int = WIDTH) -> str:
    """:func:`arguments` on one line of at most ``width`` characters."""
    return cut(arguments(entry, sensitive), width)


def cut(text: str, width: int) -> str:
    """``text`` on one line, at most ``width`` characters, an ellipsis where it was cut."""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: max(width - 1, 0)] + "…"


def _inner(text: str, *brackets: str) -> str:
    """Celery's reprs are whole literals (``"(1, 2)"``, ``"{'a': 1}"``): show their inside."""
    stripped = text.strip()
    for pair in brackets:
        if len(stripped) >= 2 and stripped[0] == pair[0] and stripped[-1] == pair[1]:
            return stripped[1:-1].rstrip(",").strip()
    return stripped
