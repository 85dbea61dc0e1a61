"""Key rotation: every stored entry read with any configured key and written again with the
first ones (signed with the first signing key, sealed with the first encryption key).

Entries are rewritten one by one with a compare-and-set on their bytes (``store.rewrite``): an
entry claimed, acked, deleted or marked dead meanwhile keeps whatever happened to it (status and
leases live beside the payload, which is all that changes here). An entry that fails the checks
(tampered, undecryptable, undecodable) is left as it is, for the drain to quarantine; an
unsigned one too unless ``adopt_unsigned`` (a person vouches for entries parked before signing
was turned on).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .backout.codec import Codec
from .backout.store import BackoutStore
from .backout.trust import UNSIGNED, Untrusted
from .errors import UndecodableEntry
from .redact import get_logger

logger = get_logger("celery_resilience.rekey")

#: Entries read per round trip.
DEFAULT_BATCH = 200


@dataclass
class RekeyReport:
    """What a rotation did; ``refused`` by the reason each entry was left alone."""

    rewritten: int = 0
    changed_meanwhile: int = 0
    refused: dict[str, int] = field(default_factory=dict)


def rekey(
    store: BackoutStore,
    codec: Codec,
    *,
    adopt_unsigned: bool = False,
    batch: int = DEFAULT_BATCH,
    progress: Callable[[int], None] | None = None,
) -> RekeyReport:
    """Re-encode every entry of ``store`` with ``codec``'s first keys, ``batch`` at a time."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    report = RekeyReport()
    offset = 0
    while True:
        # A rewrite keeps an entry's place in the store's order, so offsets stay valid; an
        # entry parked or deleted meanwhile may shift the page by one (seen twice: harmless).
        page = store.payloads(offset, batch)
        for entry_id, data in page:
            _rekey_one(store, codec, entry_id, data, adopt_unsigned, report)
        if progress is not None:
            progress(len(page))
        if len(page) < batch:
            return report
        offset += len(page)


def _rekey_one(
    store: BackoutStore,
    codec: Codec,
    entry_id: str,
    data: bytes,
    adopt_unsigned: bool,
    report: RekeyReport,
) -> None:
    try:
        entry = codec.decode(data, entry_id, trust_unsigned=adopt_unsigned)
        if entry.encrypted:
            raise Untrusted("undecryptable", "sealed, and no encryption key is configured")
        if entry.id != entry_id:
            raise UndecodableEntry(f"payload belongs to entry {entry.id}")
    except Untrusted as exc:
        report.refused[exc.code] = report.refused.get(exc.code, 0) + 1
        if exc.code != UNSIGNED:
            logger.warning("Entry %s left as it is: %s", entry_id, exc)
        return
    except UndecodableEntry as exc:
        report.refused["undecodable"] = report.refused.get("undecodable", 0) + 1
        logger.warning("Entry %s left as it is: %s", entry_id, exc)
        return
    if store.rewrite(entry_id, data, codec.encode(entry)):
        report.rewritten += 1
    else:
        report.changed_meanwhile += 1
