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
    if value and not _api_installed():
        raise invalid(
            "resilience_tracing",
            value,
            "False, or True with the opentelemetry extra installed "
            "(pip install 'celery-resilience[opentelemetry]')",
        )
    return value


def _api_installed() -> bool:
    """Whether OpenTelemetry's tracing API can be imported: ``opentelemetry`` alone is a
    namespace package that any ``opentelemetry-*`` distribution makes importable."""
    try:
        return importlib.util.find_spec("opentelemetry.trace") is not None
    except ImportError:  # no ``opentelemetry`` at all
        return False
