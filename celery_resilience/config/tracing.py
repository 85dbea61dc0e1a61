"""``resilience_tracing``: whether the package's steps make OpenTelemetry spans."""

from __future__ import annotations

import importlib.util
from typing import Any

from .values import invalid


def tracing(value: Any) -> bool:
    """``True`` or ``False``; ``True`` only where OpenTelemetry's API is importable (the
    ``opentelemetry`` extra), which is checked at start rather than at the first task."""
    if not isinstance(value, bool):
        raise invalid("resilience_tracing", value, "True or False")
    if value and importlib.util.find_spec("opentelemetry") is None:
        raise invalid(
            "resilience_tracing",
            value,
            "False, or True with the opentelemetry extra installed "
            "(pip install 'celery-resilience[opentelemetry]')",
        )
    return value
