"""Key rotation: every stored entry read with any configured key and written again with the
first ones (signed with the first signing key, sealed with the first encryption key).

The store is walked by position in its own stable order (``backout/walk.py``): every entry that
exists from the rotation's start to its end is visited, whatever drains and discards do
meanwhile. Each is rewritten with a compare-and-set on its bytes (``store.rewrite``): an entry
acked, deleted or marked dead meanwhile keeps whatever happened to it (status and leases live
beside the payload, which is all that changes here); one whose bytes changed meanwhile is read
again and tried again. Signed again, an entry gets a fresh lifetime while its old one lasts
(one written before lifetimes were signed gets its first): ``lifetime.renewed``. An entry that
fails the checks (tampered, undecryptable, undecodable, unsigned) is left as it is and
reported, as is one that could not be rewritten: the caller then says the rotation is not done.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .backout.codec import Codec
from .backout.entry import ParkedTask
from .backout.lifetime import renewed
from .backout.store import BackoutStore
from .backout.trust import UNKNOWN_KEY, Held, Judged
from .backout.walk import pages
from .errors import UndecodableEntry
from .redact import get_logger

logger = get_logger("celery_resilience.rekey")

#: Entries read per round trip.
DEFAULT_BATCH = 200
#: Reads of an entry whose bytes keep changing under the rotation before it gives up on it.
REWRITE_TRIES = 3


@dataclass
class RekeyReport:
    """What a rotation did: ``refused`` by the reason each entry was left alone; ``failed``:
    entries whose bytes kept changing under it (not rewritten); ``gone``: entries drained or
    deleted before their turn came (nothing to rewrite)."""

    rewritten: int = 0
    gone: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        """Whether every entry that still exists is readable with the first keys alone."""
        return not self.refused and not self.failed

    def refuse(self, code: str) -> None:
        self.refused[code] = self.refused.get(code, 0) + 1


def rekey(
    store: BackoutStore,
    codec: Codec,
    *,
    now: float,
    batch: int = DEFAULT_BATCH,
    progress: Callable[[int], None] | None = None,
) -> RekeyReport:
    """Re-encode every entry of ``store`` with ``codec``'s first keys, about ``batch`` a read;
    ``now``: Redis's time, when renewed lifetimes start."""
    report = RekeyReport()
    for page in pages(store, batch):
        consumed = store.consumed([i for i, _ in page])
        for entry_id, data in page:
            _rekey_one(store, codec, entry_id, data, report, Renewal(now, consumed))
        if progress is not None:
            progress(len(page))
    return report


@dataclass(frozen=True)
class Renewal:
    """When a rotation runs, and what the drain's memory says of the entries of a page."""

    now: float
    consumed: dict[str, float]

    def of(self, entry: ParkedTask, codec: Codec) -> ParkedTask:
        if codec.lifetime is None:
            return entry
        return entry.replace(expires_at=renewed(entry, self.now, codec.lifetime, self.consumed))


def _rekey_one(
    store: BackoutStore,
    codec: Codec,
    entry_id: str,
    data: bytes | None,
    report: RekeyReport,
    renewal: Renewal,
) -> None:
    for _ in range(REWRITE_TRIES):
        if data is None:
            report.gone += 1
            return
        try:
            entry = codec.decode(data, entry_id)
            if entry.held:
                raise Held(entry.held_code or UNKNOWN_KEY, entry.held)
            if entry.id != entry_id:
                raise UndecodableEntry(f"payload belongs to entry {entry.id}")
        except Judged as exc:
            report.refuse(exc.code)
            logger.warning("Entry %s left as it is: %s", entry_id, exc)
            return
        except UndecodableEntry as exc:
            report.refuse("undecodable")
            logger.warning("Entry %s left as it is: %s", entry_id, exc)
            return
        if store.rewrite(entry_id, data, codec.reencode(renewal.of(entry, codec))):
            report.rewritten += 1
            return
        data = store.payload(entry_id)  # changed under us: read again
    report.failed.append(entry_id)
    logger.warning("Entry %s not rewritten: its bytes kept changing", entry_id)
