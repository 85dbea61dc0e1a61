"""The envelope of an entry's bytes: the header line that says how to read the body, and what
a signature covers. Reading it never decodes the body, so it is safe on any stored bytes.

Versions: ``1`` (``1;<content_type>;<encoding>``, written by old releases, never signed); ``2``
(``2;<serializer>;<signature or ->``, what the previous release reads and writes); ``3``
(``3;<serializer>;<signing key id or ->;<signature or ->``, the keys named). A version above
those is a newer release's: held (:class:`~.trust.Held`), never judged.
"""

from __future__ import annotations

from dataclasses import dataclass

from kombu import serialization

from ..errors import UndecodableEntry
from .trust import NEWER_FORMAT, Held, Signer

#: The envelope the previous release reads and writes, and the one that names keys.
PREVIOUS_ENVELOPE, KEYED_ENVELOPE = 2, 3
ENVELOPES = (1, PREVIOUS_ENVELOPE, KEYED_ENVELOPE)


def signed(entry_id: str, serializer: str, body: bytes, key: str | None = None) -> bytes:
    """What a signature covers: the envelope's version, the entry id (a body moved under another
    id fails), the serializer, the key id (version 3) and every byte of the body."""
    if key is None:
        return f"{PREVIOUS_ENVELOPE}\n{entry_id}\n{serializer}\n".encode() + body
    return f"{KEYED_ENVELOPE}\n{entry_id}\n{serializer}\n{key}\n".encode() + body


def enveloped(
    body: bytes, entry_id: str, serializer: str, signer: Signer | None, version: int
) -> bytes:
    """``body`` behind the header of envelope ``version`` (2 or 3), signed with ``signer``'s
    first key (unsigned without one); the one place a header is written."""
    if signer is None:
        signature = "-"
        key = "-"
    else:
        key = signer.key_id
        signature = signer.sign(
            signed(entry_id, serializer, body, key if version >= KEYED_ENVELOPE else None)
        )
    if version < KEYED_ENVELOPE:
        header = f"{PREVIOUS_ENVELOPE};{serializer};{signature}\n"
    else:
        header = f"{KEYED_ENVELOPE};{serializer};{key};{signature}\n"
    return header.encode("ascii") + body


@dataclass(frozen=True)
class Envelope:
    """The parts of stored bytes: version, serializer, signing key id (version 3), signature
    (``None``: unsigned) and body."""

    version: int
    serializer: str
    key: str | None
    signature: str | None
    body: bytes


def _parse(data: bytes) -> Envelope:
    """``UndecodableEntry`` for bytes with no header of a known form, ``Held`` for a newer one."""
    header, newline, body = data.partition(b"\n")
    try:
        parts = header.decode("ascii").split(";")
    except UnicodeDecodeError:
        raise UndecodableEntry("no envelope header") from None
    if len(parts) < 3 or not parts[0].isdigit() or len(parts[0]) > 5:
        raise UndecodableEntry("no envelope header")
    version = int(parts[0])
    if newline and version > max(ENVELOPES):
        raise Held(NEWER_FORMAT, f"envelope version {version} is newer than this release reads")
    if not newline or version not in ENVELOPES:
        raise UndecodableEntry(f"unknown envelope version {parts[0]!r}")
    if len(parts) != (4 if version == KEYED_ENVELOPE else 3):
        raise UndecodableEntry(f"no envelope header of version {version}")
    if version == 1:  # <content_type>;<content_encoding>, never signed
        name = serialization.registry.type_to_name.get(parts[1])
        if name is None:
            raise UndecodableEntry(f"content type {parts[1]!r} is not one this store reads")
        return Envelope(1, str(name), None, None, body)
    signature = None if parts[-1] == "-" else parts[-1]
    key = None
    if version == KEYED_ENVELOPE:
        key = None if parts[2] == "-" else parts[2]
    return Envelope(version, parts[1], key, signature, body)


def envelope_of(data: bytes) -> Envelope:
    """The envelope of stored bytes (``UndecodableEntry``/``Held`` as :meth:`Codec.decode`):
    their body is not decoded, so this reads any entry safely, pickled ones included."""
    return _parse(bytes(data))
