"""The back-out store's settings: which store keeps parked tasks (``resilience_backout_store``,
:func:`backout_store_factory`) and the serializer their entries are written with."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, cast

from kombu import serialization

from ..errors import ConfigurationError
from .values import _bad, _string

_prepare_accept = cast(Callable[..., set[str]], serialization.prepare_accept_content)
#: Where ``resilience_backout_store = "django"`` finds its factory.
DJANGO_STORE = "celery_resilience.contrib.django.store.make_store"


def _serializer(value: Any, accept_content: Any) -> str:
    """A serializer kombu knows, whose content type the app accepts: otherwise every parked
    entry would be written fine and come back undecodable."""
    name = _string("resilience_serializer", value)
    content_type = serialization.registry.name_to_type.get(name)
    if content_type is None:
        known = ", ".join(sorted(serialization.registry.name_to_type))
        raise _bad("resilience_serializer", name, f"a registered serializer ({known})")
    accept = ["json"] if accept_content is None else list(accept_content)
    try:
        accepted = _prepare_accept(accept)
    except Exception as exc:  # an unknown name in accept_content
        raise ConfigurationError(f"accept_content {accept!r} can't be read: {exc}") from exc
    if content_type not in accepted:
        raise ConfigurationError(
            f"resilience_serializer {name!r} is not in accept_content {accept!r}: parked tasks "
            "could not be read back. Add it to accept_content or choose another serializer."
        )
    return name


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
        raise _bad("resilience_backout_store", path, "the dotted path of a callable factory")
    return cast(Callable[..., Any], factory)


def _backout_store(value: Any) -> str:
    path = _string("resilience_backout_store", value)
    if path != "redis":
        backout_store_factory(path)  # fails now, naming the setting, not at the first park
    return path
