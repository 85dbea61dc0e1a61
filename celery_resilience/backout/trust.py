"""The store's secrets at work: HMAC signatures over entries, and the cipher of their arguments.

Both take a list of keys for rotation: the first signs (encrypts), every one verifies
(decrypts). Each key has an id (:func:`key_id`) that an entry may carry, so that a process
lacking that key holds the entry for one that has it instead of judging it. Nothing here ever
puts a key into a message, a log line or a ``repr``; a key id reveals nothing of its key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Sequence

from ..config.trust import encryption_key_bytes
from ..errors import UndecodableEntry

#: Dead reasons of entries that failed the store's checks (the drain never publishes them).
TAMPERED = "tampered"
UNSIGNED = "unsigned"
UNDECRYPTABLE = "undecryptable"
UNTRUSTED = (TAMPERED, UNSIGNED, UNDECRYPTABLE)
#: Why an entry is held (not judged): a key this process lacks, a format of a newer release.
UNKNOWN_KEY = "unknown_key"
NEWER_FORMAT = "newer_format"
HELD_CODES = (UNKNOWN_KEY, NEWER_FORMAT)
#: Bytes of an AES-GCM nonce (random per message: safe for about 2**32 messages a key).
NONCE_BYTES = 12
#: What a key id is the HMAC of, under the key: a fixed label, so the id tells nothing of the
#: key and no signature of an entry can ever equal it.
_KEY_ID_LABEL = b"celery-resilience key id"
#: Hex digits of a key id (64 bits: a collision between a fleet's few keys is out of reach).
KEY_ID_LENGTH = 16


class Judged(UndecodableEntry):
    """Stored bytes this process judged and won't use now; ``code`` says why (a dead reason
    for :class:`Untrusted`, a held reason for :class:`Held`)."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(message)


class Untrusted(Judged):
    """Stored bytes the store won't use: ``code`` is ``tampered``, ``unsigned`` or
    ``undecryptable`` (the entry's dead reason)."""


class Held(Judged):
    """Stored bytes this process can't judge, and another may: signed or sealed with a key it
    lacks (``code`` ``unknown_key``), or written in a format of a newer release
    (``newer_format``). Such an entry stays parked, for a process that can read it."""


def _key_bytes(key: str | bytes) -> bytes:
    return key if isinstance(key, bytes) else key.encode("utf-8")


def key_id(key: bytes) -> str:
    """The public name of a key: the HMAC of a fixed label under it, cut to 16 hex digits."""
    return hmac.new(key, _KEY_ID_LABEL, hashlib.sha256).hexdigest()[:KEY_ID_LENGTH]


class Signer:
    """HMAC-SHA256 with the first key; a signature made with any of the keys verifies."""

    def __init__(self, keys: Sequence[str | bytes]) -> None:
        if not keys:
            raise ValueError("a signer needs at least one key")
        # Keyed once: each signature then costs a copy and the digest of the message.
        self._macs = [hmac.new(_key_bytes(k), digestmod=hashlib.sha256) for k in keys]
        #: The id of each key, in order: the first one's names what ``sign`` signs with.
        self.ids = [key_id(_key_bytes(k)) for k in keys]

    def __repr__(self) -> str:
        return f"<Signer of {len(self._macs)} key(s)>"

    @property
    def key_id(self) -> str:
        """The id of the key that signs."""
        return self.ids[0]

    def sign(self, message: bytes) -> str:
        mac = self._macs[0].copy()
        mac.update(message)
        return mac.hexdigest()

    def verify(self, message: bytes, signature: str, key: str | None = None) -> bool:
        """Whether ``signature`` is one of these keys' over ``message``: of the key whose id is
        ``key`` only, when given (the caller checked that this signer holds it)."""
        for ident, keyed in zip(self.ids, self._macs, strict=True):
            if key is not None and ident != key:
                continue
            mac = keyed.copy()
            mac.update(message)
            if hmac.compare_digest(mac.hexdigest(), signature):
                return True
        return False


class Cipher:
    """AES-256-GCM (from ``cryptography``) over several keys: a random 96-bit nonce per
    message, the entry id as associated data (a sealed token moved to another entry does not
    open). Chosen over Fernet for its cost: one pass, about a tenth of Fernet's CPU here."""

    def __init__(self, keys: Sequence[str | bytes]) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        raw = encryption_key_bytes("resilience_encryption_key", keys)
        self._aeads = [AESGCM(k) for k in raw]
        #: The id of each key, in order (the first one's names what ``encrypt`` seals with).
        self.ids = [key_id(k) for k in raw]

    def __repr__(self) -> str:
        return f"<Cipher of {len(self._aeads)} key(s)>"

    @property
    def key_id(self) -> str:
        """The id of the key that encrypts."""
        return self.ids[0]

    def encrypt(self, data: bytes, bound_to: bytes) -> str:
        """``data`` sealed, as url-safe base64 text: nonce, then ciphertext and tag."""
        nonce = os.urandom(NONCE_BYTES)
        sealed = nonce + self._aeads[0].encrypt(nonce, data, bound_to)
        return base64.urlsafe_b64encode(sealed).decode("ascii")

    def decrypt(self, token: str, bound_to: bytes, key: str | None = None) -> bytes:
        """The data ``token`` seals, opened with any key (with the key whose id is ``key``
        only, when given: the caller checked that this cipher holds it)."""
        from cryptography.exceptions import InvalidTag

        try:
            sealed = base64.urlsafe_b64decode(token.encode("ascii"))
        except (ValueError, UnicodeEncodeError):
            raise Untrusted(UNDECRYPTABLE, "its sealed fields are not a token") from None
        nonce, body = sealed[:NONCE_BYTES], sealed[NONCE_BYTES:]
        for ident, aead in zip(self.ids, self._aeads, strict=True):
            if key is not None and ident != key:
                continue
            try:
                return bytes(aead.decrypt(nonce, body, bound_to))
            except (InvalidTag, ValueError):
                continue
        if key is not None:
            raise Untrusted(
                UNDECRYPTABLE, f"encryption key {key}, which it names, does not open it"
            )
        raise Untrusted(UNDECRYPTABLE, "no configured encryption key opens it")
