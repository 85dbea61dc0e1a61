"""The store's secrets at work: HMAC signatures over entries, and the cipher of their arguments.

Both take a list of keys for rotation: the first signs (encrypts), every one verifies
(decrypts). Nothing here ever puts a key into a message, a log line or a ``repr``.
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
#: Bytes of an AES-GCM nonce (random per message: safe for about 2**32 messages a key).
NONCE_BYTES = 12


class Untrusted(UndecodableEntry):
    """Stored bytes the store won't use: ``code`` is ``tampered``, ``unsigned`` or
    ``undecryptable`` (the entry's dead reason)."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(message)


def _key_bytes(key: str | bytes) -> bytes:
    return key if isinstance(key, bytes) else key.encode("utf-8")


class Signer:
    """HMAC-SHA256 with the first key; a signature made with any of the keys verifies."""

    def __init__(self, keys: Sequence[str | bytes]) -> None:
        if not keys:
            raise ValueError("a signer needs at least one key")
        # Keyed once: each signature then costs a copy and the digest of the message.
        self._macs = [hmac.new(_key_bytes(k), digestmod=hashlib.sha256) for k in keys]

    def __repr__(self) -> str:
        return f"<Signer of {len(self._macs)} key(s)>"

    def sign(self, message: bytes) -> str:
        mac = self._macs[0].copy()
        mac.update(message)
        return mac.hexdigest()

    def verify(self, message: bytes, signature: str) -> bool:
        for keyed in self._macs:
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

    def __repr__(self) -> str:
        return f"<Cipher of {len(self._aeads)} key(s)>"

    def encrypt(self, data: bytes, bound_to: bytes) -> str:
        """``data`` sealed, as url-safe base64 text: nonce, then ciphertext and tag."""
        nonce = os.urandom(NONCE_BYTES)
        sealed = nonce + self._aeads[0].encrypt(nonce, data, bound_to)
        return base64.urlsafe_b64encode(sealed).decode("ascii")

    def decrypt(self, token: str, bound_to: bytes) -> bytes:
        from cryptography.exceptions import InvalidTag

        try:
            sealed = base64.urlsafe_b64decode(token.encode("ascii"))
        except (ValueError, UnicodeEncodeError):
            raise Untrusted(UNDECRYPTABLE, "its sealed fields are not a token") from None
        nonce, body = sealed[:NONCE_BYTES], sealed[NONCE_BYTES:]
        for aead in self._aeads:
            try:
                return bytes(aead.decrypt(nonce, body, bound_to))
            except (InvalidTag, ValueError):
                continue
        raise Untrusted(UNDECRYPTABLE, "no configured encryption key opens it")
