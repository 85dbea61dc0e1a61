"""An entry's body: the store's serializer through kombu's registry, read back only with the
serializer that wrote it (from an allow-list: JSON, msgpack; pickle only in a store that writes
pickle), and the mapping of fields it holds turned into a ``ParkedTask``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kombu import serialization
from kombu.utils import json as kombu_json

from ..config.trust import PICKLE, SAFE_SERIALIZERS
from ..errors import ConfigurationError, UndecodableEntry
from .entry import FIELDS, OPTIONAL, ParkedTask

#: Serializers any store reads back; pickle is added only where the store writes pickle.
ALLOWED = SAFE_SERIALIZERS

# kombu is untyped: give its entry points the types this module relies on.
_dumps: Callable[..., tuple[str, str, str | bytes]] = serialization.dumps
_loads: Callable[..., object] = serialization.loads
_json_loads: Callable[[bytes], object] = kombu_json.loads
_JSON = "application/json"


def dump(value: Any, serializer: str) -> bytes:
    _, encoding, payload = _dumps(value, serializer=serializer)
    return payload.encode(encoding) if isinstance(payload, str) else bytes(payload)


def load(body: bytes, serializer: str) -> object:
    content_type = serialization.registry.name_to_type[serializer]
    try:
        if content_type == _JSON:
            # kombu's JSON, minus its registry's lookups; the C decoder alone when no value of
            # kombu's own types (datetime, Decimal...: marked "__type__") needs its hook.
            return _json_loads(body) if b'"__type__"' in body else json.loads(body)
        encoding = "binary"
        return _loads(body, content_type, encoding, accept={content_type})
    except Exception as exc:  # any decoder (pickle above all) can raise anything on garbage
        raise UndecodableEntry(f"{serializer} body can't be decoded: {exc!r}") from exc


def readable(serializer: str) -> frozenset[str]:
    """Serializers a store writing ``serializer`` reads back; ``ConfigurationError`` if it may
    not write with it."""
    if serializer not in (*ALLOWED, PICKLE):
        raise ConfigurationError(
            f"resilience_serializer must be one of {', '.join((*ALLOWED, PICKLE))}, "
            f"got {serializer!r}"
        )
    return frozenset((*ALLOWED, serializer))


def from_fields(
    fields: object,
    *,
    encrypted: bool = False,
    held: str | None = None,
    held_code: str | None = None,
) -> ParkedTask:
    """The entry of a decoded body (``UndecodableEntry`` if it is not one)."""
    if not isinstance(fields, dict):
        raise UndecodableEntry(f"body is a {type(fields).__name__}, not a mapping")
    # Unknown fields are ignored: a newer writer may add some.
    values = {name: fields[name] for name in FIELDS if name in fields}
    missing = [name for name in FIELDS if name not in fields and name not in OPTIONAL]
    if missing:  # only OPTIONAL ones may be missing (older writers)
        raise UndecodableEntry(f"missing fields: {', '.join(missing)}")
    values["encrypted"] = encrypted
    values["held"], values["held_code"] = held, held_code
    if isinstance(values["args"], tuple):  # serializers that keep tuples (pickle)
        values["args"] = list(values["args"])
    try:
        for name in ("parked_at", "due_at", "expires_at"):
            value = values.get(name)
            # bool is an int subclass, but ``due_at=True`` is corruption: left for the check.
            if type(value) is int:
                values[name] = float(value)
        return ParkedTask(**values)
    except (TypeError, ValueError, OverflowError) as exc:
        raise UndecodableEntry(str(exc)) from exc
