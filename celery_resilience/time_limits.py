"""Deprecated alias: ``ResilientRequest``, the ``Request`` class of ``ResilientTask``, is
:class:`celery_resilience.task.ResilientRequest`; the name here works and warns (a
``DeprecationWarning``).
"""

from __future__ import annotations

import warnings
from typing import Any


def __getattr__(name: str) -> Any:
    if name != "ResilientRequest":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        "celery_resilience.time_limits.ResilientRequest is deprecated: use "
        "celery_resilience.task.ResilientRequest",
        DeprecationWarning,
        stacklevel=2,
    )
    from .task import ResilientRequest

    return ResilientRequest
