"""The small validators every setting goes through, and :func:`exception_types`.

Each takes the name to blame and the value, and returns the value (normalized) or raises
:class:`ConfigurationError` saying ``<name> must be <what>, got <value>``.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import ConfigurationError
from ..redact import is_secret_name, masked_value

T = TypeVar("T")


def invalid(setting: str, value: Any, expected: str) -> ConfigurationError:
    """The error to raise: ``<setting> must be <expected>, got <value>``. A secret never shows:
    a setting named like one gives its value's type only, and any other value is shown with
    its URLs' passwords and its secret-named options masked."""
    shown = f"a {type(value).__name__}" if is_secret_name(setting) else repr(masked_value(value))
    return ConfigurationError(f"{setting} must be {expected}, got {shown}")


def integer(setting: str, value: Any) -> int:
    # bool is an int subclass; ``failure_threshold=True`` is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise invalid(setting, value, "an integer >= 1")
    return value


def positive(setting: str, value: Any) -> float:
    """Seconds: a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise invalid(setting, value, "a number of seconds > 0")
    if not math.isfinite(value):
        raise invalid(setting, value, "a finite number")
    return float(value)


def per_second(setting: str, value: Any) -> float:
    """A rate in tasks per second (> 0, finite)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise invalid(setting, value, "a number of tasks per second > 0")
    if not math.isfinite(value):
        raise invalid(setting, value, "a finite number")
    return float(value)


def rate(setting: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise invalid(setting, value, "a rate in (0, 1]")
    return float(value)


#: Seconds in the period of a rate as Celery writes it (``"100/m"``); no unit: per second.
_PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def calls_per_second(text: str) -> float:
    """``"N/s"``, ``"N/m"``, ``"N/h"`` (or ``"N"``: per second) as calls per second; ``ValueError``
    if ``text`` is none of those, or N is not a finite number > 0."""
    number, _, unit = text.strip().partition("/")
    period = _PERIODS[unit.strip()] if unit else 1.0
    count = float(number)
    if not (math.isfinite(count) and count > 0):
        raise ValueError(text)
    return count / period


#: The slowest rate of calls a setting takes: one a day. A slower one is a mistake more likely
#: than a limit, and its wait between calls would leave the range of the lease's arithmetic.
MIN_CALLS_PER_SECOND = 1 / 86400


def call_rate(setting: str, value: Any) -> str:
    """A rate of calls as Celery writes one: ``"N/s"``, ``"N/m"`` or ``"N/h"``, at least one
    call a day."""
    expected = (
        "a rate such as '100/s', '20/m' or '500/h' (a number > 0 per s, m or h, at least "
        "one call a day, 0.0417/h)"
    )
    if not isinstance(value, str):
        raise invalid(setting, value, expected)
    try:
        per_second = calls_per_second(value)
    except (KeyError, ValueError):
        raise invalid(setting, value, expected) from None
    if per_second < MIN_CALLS_PER_SECOND:
        raise invalid(setting, value, expected)
    return value.strip()


def share(setting: str, value: Any) -> float:
    """A share of something, in [0, 1] (0 allowed, unlike :func:`rate`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise invalid(setting, value, "a ratio in [0, 1]")
    return float(value)


def non_negative(setting: str, value: Any) -> float:
    """A finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise invalid(setting, value, "a number >= 0")
    if not math.isfinite(value):
        raise invalid(setting, value, "a finite number")
    return float(value)


def string(setting: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise invalid(setting, value, "a non-empty string")
    return value


def choice(setting: str, value: Any, choices: tuple[str, ...]) -> Any:
    if value not in choices:
        raise invalid(setting, value, "one of " + ", ".join(repr(c) for c in choices))
    return value


def optional(check: Callable[[str, Any], T], setting: str, value: Any) -> T | None:
    """``check`` unless ``value`` is ``None`` (the setting is off)."""
    return None if value is None else check(setting, value)


def exception_types(owner: str, option: str, value: Any) -> tuple[type[BaseException], ...]:
    """The exception classes of option ``option`` of ``owner`` (a task or a setting).

    ``value`` is a class, an import path to one (``"pkg.mod.Class"``, ``"pkg.mod:Class"``, or
    a builtin's bare name: handy in Django settings), or a list or tuple of those. Errors name
    ``owner.option`` (a task's attribute), or ``owner['option']`` when ``owner`` is a
    ``resilience_*`` setting (a dict, whose options are keys).
    """
    name = f"{owner}[{option!r}]" if owner.startswith("resilience_") else f"{owner}.{option}"
    items = value if isinstance(value, (list, tuple)) else (value,)
    types: list[type[BaseException]] = []
    for item in items:
        resolved = _import_path(name, item) if isinstance(item, str) else item
        if not (isinstance(resolved, type) and issubclass(resolved, BaseException)):
            raise invalid(name, item, "exception classes or dotted paths to them")
        types.append(resolved)
    return tuple(types)


def task_options(
    owner: str, on_open: Any, backoff: Any, max_retries: Any, breaker: Any, key: Any = None
) -> None:
    """Check a ``ResilientTask``'s own options (class attributes), naming ``owner`` in the error."""
    if on_open not in ("park", "retry"):
        raise invalid(f"{owner}.on_open", on_open, "'park' or 'retry'")
    if not callable(backoff):
        raise invalid(f"{owner}.backoff", backoff, "a backoff strategy")
    if max_retries is not None and (
        isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0
    ):
        raise invalid(f"{owner}.max_retries", max_retries, "an integer >= 0")
    if breaker is not None and not isinstance(breaker, str):
        raise invalid(f"{owner}.breaker", breaker, "a breaker name")
    if key is not None and not (isinstance(key, str) or callable(key)):
        raise invalid(f"{owner}.breaker_key", key, "a template such as '{host}' or a callable")
    if key is not None and breaker is None:
        raise invalid(f"{owner}.breaker_key", key, "given with breaker= (the declared breaker)")


def _import_path(setting: str, path: str) -> Any:
    # No module (a bare name) is a builtin: ``"KeyError"``.
    module, _, name = path.replace(":", ".").rpartition(".")
    try:
        return getattr(importlib.import_module(module or "builtins"), name)
    except (ImportError, AttributeError, ValueError, TypeError) as exc:  # TypeError: ".x"
        raise invalid(setting, path, "an importable dotted path") from exc
