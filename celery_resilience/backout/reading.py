"""What an entry's stored bytes and metadata read as, here: the entry with its stored status, a
placeholder that says why it can't be decoded or trusted, or one that says why it is held for
another process. Every store reads its entries through :func:`read_entry`."""

from __future__ import annotations

from ..errors import UndecodableEntry
from .codec import Codec
from .entry import ParkedTask, held_placeholder, undecodable
from .store import NO_BREAKER, Meta, breaker_key
from .trust import NEWER_FORMAT, TAMPERED, Held, Untrusted


def read_entry(
    entry_id: str,
    data: bytes,
    meta: Meta,
    parked_at: float,
    codec: Codec,
) -> ParkedTask:
    """The stored entry with its stored status, or the placeholder if it can't be decoded or
    trusted (its dead reason says which: ``undecodable``, ``tampered``, ``unsigned``...), or
    can't be read here but may be elsewhere (``held`` says why; its status is the stored one).

    With signing on, meta (not signed: the store's scripts rewrite it) must agree with the
    signed payload on what decides whether the drain sends it: breaker and reason.
    """
    breaker = None if meta.breaker == NO_BREAKER else meta.breaker
    if meta.newer is not None:
        return held_placeholder(
            entry_id,
            meta.newer,
            NEWER_FORMAT,
            breaker=breaker,
            reason=meta.reason,
            parked_at=parked_at,
            status=meta.status,
            dead_reason=meta.dead_reason,
        )
    try:
        entry = codec.decode(data, entry_id)
        if entry.id != entry_id:
            raise UndecodableEntry(f"payload belongs to entry {entry.id}")
        if codec.signer is not None and (meta.breaker, meta.reason) != (
            breaker_key(entry.breaker),
            entry.reason,
        ):
            raise Untrusted(TAMPERED, "its breaker or reason was changed beside it")
    except Held as exc:
        return held_placeholder(
            entry_id,
            str(exc),
            exc.code,
            breaker=breaker,
            reason=meta.reason,
            parked_at=parked_at,
            status=meta.status,
            dead_reason=meta.dead_reason,
        )
    except UndecodableEntry as exc:
        return undecodable(
            entry_id,
            exc,
            breaker=breaker,
            reason=meta.reason,
            parked_at=parked_at,
            due_at=parked_at,
            code=exc.code if isinstance(exc, Untrusted) else "undecodable",
            status=meta.status,
        )
    if (entry.status, entry.dead_reason) != (meta.status, meta.dead_reason):
        entry = entry.replace(status=meta.status, dead_reason=meta.dead_reason)
    return entry
