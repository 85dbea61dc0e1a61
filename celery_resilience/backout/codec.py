"""An entry's bytes: the store's own serializer, a signature, and sealed arguments.

Envelope: an ASCII header line, then the body made by kombu's serializer registry::

    2;<serializer>;<signature or ->\\n<body>
    3;<serializer>;<signing key id or ->;<signature or ->\\n<body>

The header names the serializer the store wrote the body with, and only that one decodes it,
from a fixed allow-list (JSON, msgpack; pickle only in a store whose own serializer is pickle):
Celery's ``accept_content`` plays no part, so an app that accepts pickle for its tasks never
unpickles store entries. With signing keys the signature is an HMAC-SHA256 over the entry id,
the serializer, the key id (version 3) and the whole body (every field that drives a publish),
checked *before* the body is decoded. With an encryption key the fields that carry the task's
data (:data:`SEALED`) are replaced by one ``sealed`` token (AES-256-GCM, bound to the entry id;
in version 3 led by the id of the key that sealed it). Version ``1`` envelopes
(``1;<content_type>;<encoding>``, written by older releases) are still read, as unsigned.

Version 3 names the keys, so a process that lacks one holds the entry (:class:`Held`) for one
that has it, and ``tampered`` means a failure against a key this process holds. Version 2 is
what the previous release reads: it is written until the fleet's recorded minimum version says
every process reads 3 (``fleet.py``). A JSON or msgpack body names its signing key as well
(:data:`SIGNED_WITH`, a field the previous release ignores): a version-2 entry that fails here
is read unverified for that name (decoding those formats runs nothing), and held when this
process lacks the key; a pickled body is never read unverified, so fails as ``tampered``.
An envelope version above those this release knows is held too: a reader never judges what a
newer writer wrote. A body's unknown fields are ignored (a newer writer may add some; one whose
meaning a reader must not miss comes with a new envelope version). The body holds a signed
``expires_at`` (``lifetime.py``).

The payload is written once, at park time, and never rewritten by the store's scripts (status,
dead reason and leases live beside it, in meta), so one signature covers an entry's life; the
key rotation command re-encodes with the current keys.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from ..config.trust import PICKLE, SAFE_SERIALIZERS
from ..errors import UndecodableEntry
from .body import dump, from_fields, load, readable
from .entry import FIELDS, ParkedTask
from .envelope import KEYED_ENVELOPE, PREVIOUS_ENVELOPE, Envelope, envelope_of, enveloped, signed
from .lifetime import lifetime_end
from .trust import TAMPERED, UNKNOWN_KEY, UNSIGNED, Cipher, Held, Signer, Untrusted

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

#: The body's field that names the signing key's id (JSON and msgpack bodies).
SIGNED_WITH = "signed_with"


class Codec:
    """How one store writes and reads entries: its serializer, its keys, the envelope it writes
    (``envelope()``: 2 or 3, asked at each write) and the signed lifetime of a new entry."""

    def __init__(
        self,
        serializer: str = "json",
        signing_keys: Sequence[str | bytes] = (),
        encryption_keys: Sequence[str | bytes] = (),
        *,
        lifetime: float | None = None,
        envelope: Callable[[], int] | None = None,
    ) -> None:
        self.serializer = serializer
        self.readable = readable(serializer)
        self.signer = Signer(signing_keys) if signing_keys else None
        self.cipher = Cipher(encryption_keys) if encryption_keys else None
        #: Seconds a new entry's signed lifetime lasts (``None``: it gets none).
        self.lifetime = lifetime
        self.envelope: Callable[[], int] = envelope or (lambda: PREVIOUS_ENVELOPE)

    def __repr__(self) -> str:
        signed = "signed" if self.signer else "unsigned"
        sealed = "encrypted" if self.cipher else "clear"
        return f"<Codec {self.serializer} {signed} {sealed}>"

    @classmethod
    def of(cls, config: Any, envelope: Callable[[], int] | None = None) -> Codec:
        """The codec of a ``ResilienceConfig``."""
        return cls(
            config.serializer,
            config.signing_keys,
            config.encryption_keys,
            lifetime=config.entry_lifetime,
            envelope=envelope,
        )

    def encode(self, entry: ParkedTask) -> bytes:
        """A new entry as bytes, its signed lifetime starting when it is due (its park time, or
        later: :func:`~.lifetime.lifetime_end`; both are Redis's times); kombu's
        ``EncodeError`` if its args can't be serialized."""
        if entry.expires_at is None and self.lifetime is not None:
            entry = entry.replace(expires_at=lifetime_end(entry, entry.parked_at, self.lifetime))
        return self.reencode(entry)

    def reencode(self, entry: ParkedTask) -> bytes:
        """``entry`` as bytes with this codec's first keys, its lifetime kept as it is."""
        version = self.envelope()
        body: dict[str, Any] = {name: getattr(entry, name) for name in FIELDS}
        if self.signer is not None and self.serializer in SAFE_SERIALIZERS:
            # Inside the signed body too, which envelope 2 (no key in its header) carries: a
            # process that lacks this key holds the entry instead of judging it tampered.
            body[SIGNED_WITH] = self.signer.key_id
        if self.cipher is not None:
            plain = dump({name: body[name] for name in SEALED}, self.serializer)
            token = self.cipher.encrypt(plain, entry.id.encode())
            if version >= KEYED_ENVELOPE:
                token = f"{self.cipher.key_id}:{token}"
            body.update(_EMPTY, sealed=token)
        data = dump(body, self.serializer)
        return enveloped(data, entry.id, self.serializer, self.signer, version)

    def decode(self, data: bytes, entry_id: str | None = None) -> ParkedTask:
        """The entry stored in ``data`` under ``entry_id``: ``Untrusted`` if it fails the
        signature check against a key this process holds, ``Held`` if it names a key this
        process lacks or comes in a newer release's envelope, ``UndecodableEntry`` for the
        rest. Without the encryption key, a sealed entry comes back ``encrypted`` and held."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise UndecodableEntry(f"expected bytes, got {type(data).__name__}")
        envelope = envelope_of(data)
        serializer = envelope.serializer
        if serializer not in self.readable:
            raise UndecodableEntry(f"serializer {serializer!r} is not one this store reads")
        if self.signer is not None:
            self.check_signature(envelope, entry_id)
        fields = load(envelope.body, serializer)
        if isinstance(fields, dict) and "sealed" in fields:
            return self._unsealed(fields, serializer)
        return from_fields(fields)

    def check_signature(self, envelope: Envelope, entry_id: str | None) -> None:
        """``Untrusted`` or ``Held`` unless ``envelope`` is signed by one of this codec's keys."""
        signer = self.signer
        assert signer is not None
        if envelope.signature is None:
            raise Untrusted(UNSIGNED, "it carries no signature and signing is on")
        key = envelope.key
        if key is not None and key not in signer.ids:
            raise _lacking(key, signer)
        message = signed(entry_id or "", envelope.serializer, envelope.body, key)
        if entry_id is None or not signer.verify(message, envelope.signature, key):
            named = None if key is not None else _key_in_body(envelope)
            if named is not None and named not in signer.ids:
                raise _lacking(named, signer, "its body says")
            which = f"key {key}" if key else f"any of its {len(signer.ids)} key(s)"
            raise Untrusted(
                TAMPERED, f"its signature does not match its content with {which} held here"
            )

    def _unsealed(self, fields: dict[str, Any], serializer: str) -> ParkedTask:
        token = fields.get("sealed")
        if not isinstance(token, str):
            raise UndecodableEntry("sealed field is not a token")
        key, _, rest = token.rpartition(":")  # version 3 leads with the key's id
        if self.cipher is None:  # listed, never published: see ParkedTask.held
            why = f"sealed with key {key}" if key else "sealed"
            held = f"{why}, and this process has no encryption key"
            return from_fields(
                {**fields, **_EMPTY}, encrypted=True, held=held, held_code=UNKNOWN_KEY
            )
        if key and key not in self.cipher.ids:
            held = f"sealed with encryption key {key}, which this process lacks"
            return from_fields(
                {**fields, **_EMPTY}, encrypted=True, held=held, held_code=UNKNOWN_KEY
            )
        return from_fields(
            _unseal(self.cipher, {**fields, "sealed": rest}, serializer, key or None)
        )


def _unseal(
    cipher: Cipher, fields: dict[str, Any], serializer: str, key: str | None
) -> dict[str, Any]:
    """``fields`` with the sealed ones opened (the token is bound to the body's entry id)."""
    token = fields.pop("sealed")
    if not isinstance(token, str) or not isinstance(fields.get("id"), str):
        raise UndecodableEntry("sealed field is not a token")
    inner = load(cipher.decrypt(token, fields["id"].encode(), key), serializer)
    if not isinstance(inner, dict) or set(inner) != set(SEALED):
        raise UndecodableEntry("sealed fields are not the expected ones")
    return {**fields, **inner}


def _lacking(key: str, signer: Signer, said: str = "") -> Held:
    by = f" ({said}, unverified)" if said else ""
    return Held(
        UNKNOWN_KEY,
        f"signed with key {key}{by}, which this process lacks (it holds {', '.join(signer.ids)})",
    )


def _key_in_body(envelope: Envelope) -> str | None:
    """The signing key's id an envelope-2 body names (:data:`SIGNED_WITH`), read unverified,
    from JSON and msgpack only (decoding them runs nothing): a forged one can only keep the
    entry held. ``None`` for pickle, or when the body names none."""
    if envelope.serializer not in SAFE_SERIALIZERS:
        return None
    try:
        fields = load(envelope.body, envelope.serializer)
    except UndecodableEntry:
        return None
    named = fields.get(SIGNED_WITH) if isinstance(fields, dict) else None
    return named if isinstance(named, str) and named else None


def signed_again(codec: Codec, envelope: Envelope, entry_id: str) -> bytes:
    """The same body, signed by ``codec``'s first key, in the envelope it writes: what adopting
    an unsigned entry writes (the body is not decoded to be signed)."""
    assert codec.signer is not None
    body, serializer = envelope.body, envelope.serializer
    return enveloped(body, entry_id, serializer, codec.signer, codec.envelope())


def encode(entry: ParkedTask, serializer: str = "json") -> bytes:
    """``entry`` as unsigned, unencrypted bytes in ``serializer``."""
    return Codec(serializer).encode(entry)


def decode(data: bytes, serializers: Collection[str] | None = None) -> ParkedTask:
    """The entry in ``data``, read as a store of no keys reads it; ``serializers`` names the
    store's own (pickle is read only when named)."""
    own = PICKLE if serializers and PICKLE in serializers else "json"
    return Codec(own).decode(data)
