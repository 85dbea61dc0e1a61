"""The back-out store's trust settings: its serializer (from an allow-list), the signing keys,
the encryption keys, the argument names every surface masks and what of an error's message
leaves the store. No key is ever part of an error message."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, Literal, cast

from ..errors import ConfigurationError
from .values import choice, invalid

#: Serializers the store may write with; pickle only when ``resilience_serializer`` names it.
SAFE_SERIALIZERS = ("json", "msgpack")
PICKLE = "pickle"
#: Shortest signing key accepted (bytes): an HMAC key shorter than this is guessable.
MIN_SIGNING_KEY = 16
#: Bytes of an encryption key (AES-256-GCM).
AES_KEY_BYTES = 32

Keys = tuple[str | bytes, ...]
#: ``resilience_error_text``: the message as raised, the exception's type only, or the message
#: with the values of the sensitive arguments masked.
ErrorText = Literal["full", "type", "masked"]
ERROR_TEXTS: tuple[ErrorText, ...] = ("full", "type", "masked")


def serializer(named: Any, task_serializer: Any) -> str:
    """``resilience_serializer`` if set (JSON, msgpack or, named explicitly, pickle), else the
    app's ``task_serializer`` when it is a safe one, else JSON. ``accept_content`` plays no part:
    the store reads back only what it wrote."""
    if named is None or named == "":
        return task_serializer if task_serializer in SAFE_SERIALIZERS else "json"
    if named not in (*SAFE_SERIALIZERS, PICKLE):
        raise invalid("resilience_serializer", named, "one of 'json', 'msgpack', 'pickle'")
    return str(named)


def _keys(setting: str, value: Any) -> Keys:
    if value is None or value in ("", b""):
        return ()
    values = [value] if isinstance(value, (str, bytes)) else value
    if not isinstance(values, Sequence) or not values:
        raise ConfigurationError(f"{setting} must be a secret string or a non-empty list of them")
    for position, key in enumerate(values):
        if not isinstance(key, (str, bytes)) or not key:
            raise ConfigurationError(
                f"{setting}: key #{position + 1} must be a non-empty string "
                f"(got a {type(key).__name__})"
            )
    return tuple(values)


def signing_keys(value: Any) -> Keys:
    """``resilience_signing_key``: a secret or a list (the first signs, all verify)."""
    keys = _keys("resilience_signing_key", value)
    for position, key in enumerate(keys):
        size = len(key if isinstance(key, bytes) else key.encode())
        if size < MIN_SIGNING_KEY:
            raise ConfigurationError(
                f"resilience_signing_key: key #{position + 1} is {size} bytes long, "
                f"fewer than {MIN_SIGNING_KEY}"
            )
    return keys


def pickle_signed(named: str, keys: Keys) -> Keys:
    """``keys``, once checked that a pickle store has some: whoever can write one unsigned
    pickled entry would run code in every process that reads the store."""
    if named == PICKLE and not keys:
        raise ConfigurationError(
            "resilience_serializer = 'pickle' needs resilience_signing_key: without it, whoever "
            "can write to the back-out store runs code in every process that reads it. Set "
            "resilience_signing_key, or use 'json' or 'msgpack'."
        )
    return keys


def encryption_keys(value: Any) -> Keys:
    """``resilience_encryption_key``: AES-256 keys (the first encrypts, all decrypt)."""
    keys = _keys("resilience_encryption_key", value)
    if keys:
        encryption_key_bytes("resilience_encryption_key", keys)  # fails now, at start
    return keys


def encryption_key_bytes(setting: str, keys: Sequence[str | bytes]) -> list[bytes]:
    """The AES-256 keys of ``keys`` (each 32 url-safe base64-encoded bytes, the form
    ``Fernet.generate_key()`` makes); ``ConfigurationError`` naming ``setting``, never a key."""
    try:
        import cryptography  # noqa: F401  (the extra: say so now, not at the first park)
    except ImportError:
        raise ConfigurationError(
            f"{setting} needs the 'cryptography' package: "
            "pip install 'celery-resilience[encryption]'"
        ) from None
    decoded = []
    for position, key in enumerate(keys):
        try:
            raw = base64.urlsafe_b64decode(key if isinstance(key, bytes) else key.encode())
        except (ValueError, TypeError):
            raw = b""
        if len(raw) != AES_KEY_BYTES:
            raise ConfigurationError(
                f"{setting}: key #{position + 1} is not {AES_KEY_BYTES} url-safe base64-encoded "
                "bytes (make one with Fernet.generate_key())"
            )
        decoded.append(raw)
    if not decoded:
        raise ConfigurationError(f"{setting} holds no key")
    return decoded


def sensitive_keys(value: Any) -> tuple[str, ...]:
    """``resilience_sensitive_keys``: argument names whose values are masked wherever a person
    reads a parked task (matched case-insensitively, at any depth of the arguments)."""
    setting = "resilience_sensitive_keys"
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple, set, frozenset)):
        raise invalid(setting, value, "a list of argument names")
    for name in value:
        if not isinstance(name, str) or not name:
            raise invalid(setting, value, "a list of non-empty argument names")
    return tuple(sorted({name.lower() for name in value}))


def error_text(value: Any, encrypted: bool) -> ErrorText:
    """``resilience_error_text``: what of a task's error message reaches the result backend,
    the ``task-parked`` event and log lines. By default no more than the store shows without a
    key: the type only when an encryption key seals error texts in the store, else the message
    with the sensitive arguments' values masked (all of it while no key is sensitive)."""
    if value is None:
        return "type" if encrypted else "masked"
    return cast(ErrorText, choice("resilience_error_text", value, ERROR_TEXTS))
