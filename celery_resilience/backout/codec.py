"""An entry's bytes: the store's own serializer, a signature, and sealed arguments.

Envelope: an ASCII header line, then the body made by kombu's serializer registry::

    2;<serializer>;<signature or ->\\n<body>

The header names the serializer the store wrote the body with, and only that one decodes it,
from a fixed allow-list (JSON, msgpack; pickle only in a store whose own serializer is pickle):
Celery's ``accept_content`` plays no part, so an app that accepts pickle for its tasks never
unpickles store entries. With signing keys the signature is an HMAC-SHA256 over the entry id,
the serializer and the whole body (every field that drives a publish), checked *before* the body
is decoded. With an encryption key the fields that carry the task's data (:data:`SEALED`) are
replaced by one ``sealed`` token (AES-256-GCM, bound to the entry id). Version ``1``
envelopes (``1;<content_type>;<encoding>``, written by older releases) are still read, as
unsigned.

The payload is written once, at park time, and never rewritten by the store's scripts (status,
dead reason and leases live beside it, in meta), so one signature covers an entry's life; the
key rotation command re-encodes with the current keys.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from typing import Any

from kombu import serialization
from kombu.utils import json as kombu_json

from ..config.trust import PICKLE, SAFE_SERIALIZERS
from ..errors import ConfigurationError, UndecodableEntry
from .entry import FIELDS, ParkedTask
from .trust import TAMPERED, UNSIGNED, Cipher, Signer, Untrusted

ENVELOPE_VERSION = "2"
#: Serializers any store reads back; pickle is added only where the store writes pickle.
ALLOWED = SAFE_SERIALIZERS
#: Fields sealed by the encryption key: the task's own data (its options carry argsrepr,
#: kwargsrepr, headers and the signatures of linked tasks; errors often quote arguments).
SEALED = ("args", "kwargs", "options", "exc_message", "traceback")
_EMPTY: dict[str, Any] = {
    "args": [],
    "kwargs": {},
    "options": {},
    "exc_message": "",
    "traceback": "",
}

# kombu is untyped: give its entry points the types this module relies on.
_dumps: Callable[..., tuple[str, str, str | bytes]] = serialization.dumps
_loads: Callable[..., object] = serialization.loads
_json_loads: Callable[[bytes], object] = kombu_json.loads
_JSON = "application/json"


def _dump(value: Any, serializer: str) -> bytes:
    _, encoding, payload = _dumps(value, serializer=serializer)
    return payload.encode(encoding) if isinstance(payload, str) else bytes(payload)


def _load(body: bytes, serializer: str) -> object:
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


class Codec:
    """How one store writes and reads entries: its serializer and its keys."""

    def __init__(
        self,
        serializer: str = "json",
        signing_keys: Sequence[str | bytes] = (),
        encryption_keys: Sequence[str | bytes] = (),
    ) -> None:
        self.serializer = serializer
        self.readable = readable(serializer)
        self.signer = Signer(signing_keys) if signing_keys else None
        self.cipher = Cipher(encryption_keys) if encryption_keys else None

    def __repr__(self) -> str:
        signed = "signed" if self.signer else "unsigned"
        sealed = "encrypted" if self.cipher else "clear"
        return f"<Codec {self.serializer} {signed} {sealed}>"

    @classmethod
    def of(cls, config: Any) -> Codec:
        """The codec of a ``ResilienceConfig``."""
        return cls(config.serializer, config.signing_keys, config.encryption_keys)

    def encode(self, entry: ParkedTask) -> bytes:
        """``entry`` as bytes; kombu's ``EncodeError`` if its args can't be serialized."""
        body: dict[str, Any] = {name: getattr(entry, name) for name in FIELDS}
        if self.cipher is not None:
            plain = _dump({name: body[name] for name in SEALED}, self.serializer)
            body.update(_EMPTY, sealed=self.cipher.encrypt(plain, entry.id.encode()))
        data = _dump(body, self.serializer)
        signature = (
            "-"
            if self.signer is None
            else self.signer.sign(_signed(entry.id, self.serializer, data))
        )
        return f"{ENVELOPE_VERSION};{self.serializer};{signature}\n".encode("ascii") + data

    def decode(
        self, data: bytes, entry_id: str | None = None, *, trust_unsigned: bool = False
    ) -> ParkedTask:
        """The entry stored in ``data`` under ``entry_id``: ``Untrusted`` if it fails the
        signature check (``unsigned`` is let through with ``trust_unsigned``: the key rotation
        command adopting entries parked before signing was on), ``UndecodableEntry`` for the
        rest. Without the encryption key, a sealed entry comes back ``encrypted``."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise UndecodableEntry(f"expected bytes, got {type(data).__name__}")
        serializer, signature, body = _envelope(bytes(data))
        if serializer not in self.readable:
            raise UndecodableEntry(f"serializer {serializer!r} is not one this store reads")
        if self.signer is not None:
            if signature is None:
                if not trust_unsigned:
                    raise Untrusted(UNSIGNED, "it carries no signature and signing is on")
            elif entry_id is None or not self.signer.verify(
                _signed(entry_id, serializer, body), signature
            ):
                raise Untrusted(TAMPERED, "its signature does not match its content")
        fields = _load(body, serializer)
        if isinstance(fields, dict) and "sealed" in fields:
            if self.cipher is None:  # listed, never published: see ParkedTask.encrypted
                return from_fields({**fields, **_EMPTY}, encrypted=True)
            fields = _unseal(self.cipher, fields, serializer)
        return from_fields(fields)


def _unseal(cipher: Cipher, fields: dict[str, Any], serializer: str) -> dict[str, Any]:
    """``fields`` with the sealed ones opened (the token is bound to the body's entry id)."""
    token = fields.pop("sealed")
    if not isinstance(token, str) or not isinstance(fields.get("id"), str):
        raise UndecodableEntry("sealed field is not a token")
    inner = _load(cipher.decrypt(token, fields["id"].encode()), serializer)
    if not isinstance(inner, dict) or set(inner) != set(SEALED):
        raise UndecodableEntry("sealed fields are not the expected ones")
    return {**fields, **inner}


def _signed(entry_id: str, serializer: str, body: bytes) -> bytes:
    """What a signature covers: the entry id (a body moved under another id fails), the
    serializer and every byte of the body."""
    return f"{ENVELOPE_VERSION}\n{entry_id}\n{serializer}\n".encode() + body


def _envelope(data: bytes) -> tuple[str, str | None, bytes]:
    """(serializer, signature or None, body) of the stored bytes."""
    header, newline, body = data.partition(b"\n")
    try:
        version, first, second = header.decode("ascii").split(";")
    except (UnicodeDecodeError, ValueError):
        raise UndecodableEntry("no envelope header") from None
    if not newline or version not in ("1", ENVELOPE_VERSION):
        raise UndecodableEntry(f"unknown envelope version {version!r}")
    if version == "1":  # <content_type>;<content_encoding>, never signed
        name = serialization.registry.type_to_name.get(first)
        if name is None:
            raise UndecodableEntry(f"content type {first!r} is not one this store reads")
        return str(name), None, body
    return first, (None if second == "-" else second), body


def from_fields(fields: object, *, encrypted: bool = False) -> ParkedTask:
    """The entry of a decoded body (``UndecodableEntry`` if it is not one)."""
    if not isinstance(fields, dict):
        raise UndecodableEntry(f"body is a {type(fields).__name__}, not a mapping")
    # Unknown fields are ignored: a newer writer may add some.
    values = {name: fields[name] for name in FIELDS if name in fields}
    if len(values) < len(FIELDS) - 1:  # only dead_reason may be missing (older writers)
        missing = [name for name in FIELDS if name not in fields and name != "dead_reason"]
        if missing:
            raise UndecodableEntry(f"missing fields: {', '.join(missing)}")
    values["encrypted"] = encrypted
    if isinstance(values["args"], tuple):  # serializers that keep tuples (pickle)
        values["args"] = list(values["args"])
    try:
        for name in ("parked_at", "due_at"):
            value = values[name]
            # bool is an int subclass, but ``due_at=True`` is corruption: left for the check.
            if type(value) is int:
                values[name] = float(value)
        return ParkedTask(**values)
    except (TypeError, ValueError, OverflowError) as exc:
        raise UndecodableEntry(str(exc)) from exc


def encode(entry: ParkedTask, serializer: str = "json") -> bytes:
    """``entry`` as unsigned, unencrypted bytes in ``serializer``."""
    return Codec(serializer).encode(entry)


def decode(data: bytes, serializers: Collection[str] | None = None) -> ParkedTask:
    """The entry in ``data``, read as a store of no keys reads it; ``serializers`` names the
    store's own (pickle is read only when named)."""
    own = PICKLE if serializers and PICKLE in serializers else "json"
    return Codec(own).decode(data)
