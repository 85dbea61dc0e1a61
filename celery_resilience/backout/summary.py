"""A short, masked summary of a parked task's arguments, for people: admin, CLI, logs, events.

Parked tasks hold customer data, and the surfaces that list them are read by more people than
the code that wrote them. So what a person sees goes through one function: Celery's own
``argsrepr``/``kwargsrepr`` when the caller set them (``apply_async(argsrepr=...)`` is how an app
already hides arguments from Flower and the logs), else the arguments with every sensitive value
(``resilience_sensitive_keys``, by keyword, by position or at any depth: :mod:`.masking`)
replaced by a mask, cut to a width.
"""

from __future__ import annotations

from typing import Any

from ..redact import MASK
from .entry import ParkedTask
from .masking import EVERY_KEY, SHOW_ALL, Masking

__all__ = ["EVERY_KEY", "MASK", "SEALED", "WIDTH", "arguments", "call", "cut", "summary"]

#: What the arguments of an entry read without its encryption key show.
SEALED = "<encrypted>"
#: Default width of a summary (characters), an ellipsis included.
WIDTH = 80


def arguments(entry: ParkedTask, masking: Masking = SHOW_ALL) -> str:
    """The whole call as a person may see it: ``1, 'a', order_id=15, card_token='***'``."""
    if entry.encrypted:
        return SEALED
    options = entry.options
    return call(
        entry.task_name,
        entry.args,
        entry.kwargs,
        options.get("argsrepr"),
        options.get("kwargsrepr"),
        masking,
    )


def call(
    task_name: str,
    args: Any,
    kwargs: Any,
    argsrepr: Any,
    kwargsrepr: Any,
    masking: Masking = SHOW_ALL,
) -> str:
    """``args`` and ``kwargs`` as :func:`arguments` shows them (a task's request has them
    apart: the log line of a task that could not be parked)."""
    if isinstance(argsrepr, str):
        shown_args = _inner(argsrepr, "()", "[]")
    else:
        shown_args = ", ".join(repr(a) for a in masking.args(task_name, args))
    if isinstance(kwargsrepr, str):  # a dict literal: shown as the call would spread it
        inner = _inner(kwargsrepr, "{}")
        shown_kwargs = f"**{{{inner}}}" if inner else ""
    else:
        shown = masking.value(dict(kwargs or {}))
        shown_kwargs = ", ".join(f"{key}={value!r}" for key, value in shown.items())
    return ", ".join(part for part in (shown_args, shown_kwargs) if part)


def summary(entry: ParkedTask, masking: Masking = SHOW_ALL, width: int = WIDTH) -> str:
    """:func:`arguments` on one line of at most ``width`` characters."""
    return cut(arguments(entry, masking), width)


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
