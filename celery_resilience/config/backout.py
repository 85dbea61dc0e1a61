"""The back-out store's settings: which store keeps parked tasks (``resilience_backout_store``,
:func:`backout_store_factory`); the serializer and keys of their entries are in ``trust.py``."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, cast

from ..errors import ConfigurationError
from .values import invalid, string

#: Where ``resilience_backout_store = "django"`` finds its factory.
DJANGO_STORE = "celery_resilience.contrib.django.store.make_store"


def backout_store_factory(path: str) -> Callable[..., Any]:
    """The factory named by ``resilience_backout_store`` (``"django"`` or a dotted path)."""
    dotted = DJANGO_STORE if path == "django" else path.replace(":", ".")
    module, _, name = dotted.rpartition(".")
    try:
        factory = getattr(importlib.import_module(module), name)
    except Exception as exc:  # whatever importing it raised (AppRegistryNotReady...): name it
        raise ConfigurationError(
            "resilience_backout_store must be 'redis', 'django' or the dotted path of an "
            f"importable factory, got {path!r} ({type(exc).__name__}: {exc})"
        ) from exc
    if not callable(factory):
        raise invalid("resilience_backout_store", path, "the dotted path of a callable factory")
    return cast(Callable[..., Any], factory)


def backout_store_path(value: Any) -> str:
    path = string("resilience_backout_store", value)
    if path != "redis":
        backout_store_factory(path)  # fails now, naming the setting, not at the first park
    return path
