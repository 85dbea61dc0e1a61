"""The store's secrets at work: HMAC signatures over entries, and the cipher of their arguments.

Both take a list of keys for rotation: the first signs (encrypts), every one verifies
(decrypts). Nothing here ever puts a key into a message, a log line or a ``repr``.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from ..config.trust import multi_fernet
from .entry import UndecodableEntry

#: Dead reasons of entries that failed the store's checks (the drain never publishes them).
TAMPERED = "tampered"
UNSIGNED = "unsigned"
UNDECRYPTABLE = "undecryptable"
UNTRUSTED = (TAMPERED, UNSIGNED, UNDECRYPTABLE)


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
    """Fernet (AES-128-CBC + HMAC-SHA256, from ``cryptography``) over several keys."""

    def __init__(self, keys: Sequence[str | bytes]) -> None:
        self._fernet = multi_fernet("resilience_encryption_key", keys)

    def __repr__(self) -> str:
        return "<Cipher>"

    def encrypt(self, data: bytes) -> bytes:
        return bytes(self._fernet.encrypt(data))

    def decrypt(self, token: bytes) -> bytes:
        from cryptography.fernet import InvalidToken

        try:
            return bytes(self._fernet.decrypt(token))
        except (InvalidToken, TypeError, ValueError):
            raise Untrusted(UNDECRYPTABLE, "no configured encryption key opens it") from None
