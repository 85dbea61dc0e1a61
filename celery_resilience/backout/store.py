"""The contract of a back-out store, and the small bookkeeping every backend shares.

Status lives beside the payload (in :class:`Meta`), not only inside it: ``mark_dead`` and the
filters then never need to decode a payload, so an undecodable entry can still be counted,
filtered, marked dead and deleted. Reads overlay the stored status on the decoded entry.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..errors import UndecodableEntry
from .codec import Codec
from .entry import REASONS, STATUSES, ParkedTask, Reason, Status, undecodable
from .trust import TAMPERED, Untrusted

#: Internal breaker name of entries parked without a breaker. ``ParkedTask.breaker`` reports
#: them as ``None``; ``breakers()`` lists the group as ``NO_BREAKER`` and the ``breaker`` filter
#: of ``count``/``list``/``purge`` accepts it (``breaker=None`` there means "any breaker").
NO_BREAKER = "-"
#: Dead reason of an entry whose metadata this release can't read.
UNREADABLE_META = "unreadable_meta"


@dataclass(frozen=True)
class Filter:
    """Which entries ``count``, ``list`` and ``purge`` mean; a field left ``None`` matches any.

    One value instead of loose ``breaker, status, reason`` arguments: the public
    ``Backout.list(breaker, status, limit, ...)`` and the store once took them in different
    orders, and a string passed in the wrong place type-checked. ``breaker`` is a breaker name
    or :data:`NO_BREAKER`. A filter is checked when made, so a typo fails where it was written
    and never looks like an empty store.
    """

    breaker: str | None = None
    status: Status | None = None
    reason: Reason | None = None

    def __post_init__(self) -> None:
        if self.status is not None and self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")
        if self.reason is not None and self.reason not in REASONS:
            raise ValueError(f"reason must be one of {REASONS}, got {self.reason!r}")

    def matches(self, meta: Meta) -> bool:
        """Whether the entry of ``meta`` is one of these (no payload needs decoding)."""
        return (
            (self.breaker is None or self.breaker == meta.breaker)
            and (self.status is None or self.status == meta.status)
            and (self.reason is None or self.reason == meta.reason)
        )


#: Every entry.
ANY = Filter()
#: Entries ``oldest_parked`` looks at, oldest first, before it gives up.
OLDEST_SCAN = 10_000


class EntryStore(Protocol):
    """Durable storage of parked tasks: what parking, the CLI and the admin need.

    ``count``, ``list`` and ``purge`` take which entries as one :class:`Filter` (``ANY``: all).
    An entry in flight (claimed by a drain, not yet acked) still reads as ``parked``.
    """

    def park(self, entry: ParkedTask) -> None:
        """Store ``entry`` durably; a no-op if its id is stored already; ``StoreFull`` if full."""

    def get(self, entry_id: str) -> ParkedTask | None:
        """The entry, a placeholder if its bytes can't be decoded, ``None`` if absent."""

    def count(self, where: Filter = ANY) -> int:
        """Number of matching entries, undecodable ones included."""

    def list(
        self, where: Filter = ANY, limit: int = 100, offset: int = 0
    ) -> builtins.list[ParkedTask]:
        """Matching entries, newest ``parked_at`` first."""

    def delete(self, entry_id: str) -> bool:
        """Remove one entry; ``False`` if it was not there."""

    def purge(self, where: Filter = ANY, progress: Callable[[int], None] | None = None) -> int:
        """Remove every matching entry; the number removed. In batches, each one atomic, so
        that no single step blocks the store for long: ``progress(n)`` after each batch of n.
        An interrupted purge has removed whole entries only."""

    def breakers(self) -> set[str]:
        """Breaker names that have entries (:data:`NO_BREAKER` for entries without one)."""

    def tally(self) -> dict[tuple[str, str], int]:
        """Entries per (breaker, status), in one read (the metrics' scrape: a count per breaker
        would read the counters once a breaker)."""

    def with_prefix(self, prefix: str, limit: int = 20) -> builtins.list[ParkedTask]:
        """Entries whose id starts with ``prefix``, at most ``limit``, newest first."""

    def with_task_id(self, task_id: str, limit: int = 20) -> builtins.list[ParkedTask]:
        """Entries of the Celery task ``task_id``, at most ``limit``, newest first."""

    def oldest_parked(self) -> float | None:
        """``parked_at`` of the oldest entry still ``parked`` (dead ones wait for a person, not
        for the drain); ``None`` when none is, or when more than :data:`OLDEST_SCAN` dead
        entries are older than every parked one (a scrape must stay cheap)."""

    def mark_dead(self, entry_id: str, dead_reason: str) -> bool:
        """Move a parked entry to dead (out of the ready set); ``False`` if absent or dead."""

    def expire_dead(self) -> int:
        """Remove entries dead for longer than ``dead_ttl`` (none when unset); the number."""

    def payloads(self, offset: int, limit: int) -> builtins.list[tuple[str, bytes]]:
        """Stored bytes of up to ``limit`` entries from ``offset``, in a stable order (the key
        rotation command pages through them)."""

    def rewrite(self, entry_id: str, old: bytes, new: bytes) -> bool:
        """Replace an entry's bytes with ``new`` if they still are ``old``; whether it did."""


class Claims(Protocol):
    """The drain's side of a store: lease due entries, then ack or give them back."""

    def claim(
        self, breaker: str, limit: int, lease: float, now: float | None = None
    ) -> builtins.list[ParkedTask]:
        """Lease up to ``limit`` due entries of ``breaker`` to the caller (the drain).

        Until acked or released they are not due; if the caller dies, they are due again when
        the lease ends. Undecodable ones come back as placeholders (``dead_reason`` set).
        """

    def ack(self, breaker: str, entry_ids: Sequence[str]) -> int:
        """Remove claimed entries of ``breaker`` once they were published; the number removed."""

    def release(self, breaker: str, entry_ids: Sequence[str], due_at: float) -> int:
        """Give claimed entries back, due again at ``due_at``; the number given back."""

    def in_flight(self) -> int:
        """Entries claimed and still under lease."""

    def due(self, breaker: str, now: float | None = None) -> int:
        """Entries of ``breaker`` that are due now."""


class Counters(Protocol):
    """Monotonic counters kept beside the entries, for metrics."""

    def stats(self) -> dict[str, float]:
        """``parked|<breaker>|<reason>``, ``retries|<breaker>``, what drains added."""

    def bump(self, counters: dict[str, float]) -> None:
        """Add to the counters of ``stats`` (one round trip)."""


class BackoutStore(EntryStore, Claims, Counters, Protocol):
    """What a back-out backend implements: every one passes ``tests/test_backout_store.py``."""


@dataclass(frozen=True)
class Meta:
    """What filters and status changes need, kept small and apart from the payload.

    Text form ``status|reason|dead_reason|breaker``: the breaker comes last so it may hold ``|``.
    """

    breaker: str
    status: Status
    reason: Reason
    dead_reason: str | None = None

    @classmethod
    def of(cls, entry: ParkedTask) -> Meta:
        return cls(breaker_key(entry.breaker), entry.status, entry.reason, entry.dead_reason)

    def encode(self) -> str:
        return f"{self.status}|{self.reason}|{self.dead_reason or ''}|{self.breaker}"

    @classmethod
    def decode(cls, text: str | bytes) -> Meta:
        raw = text.decode(errors="replace") if isinstance(text, bytes) else text
        parts = raw.split("|", 3)
        if len(parts) != 4:
            return cls(NO_BREAKER, "dead", "park_on", UNREADABLE_META)
        status, reason, dead_reason, breaker = parts
        if status not in STATUSES or reason not in REASONS:
            # Written by another release or by hand: quarantined, never a reason to stop a drain.
            return cls(breaker, "dead", reason if reason in REASONS else "park_on", UNREADABLE_META)
        return cls(breaker, status, reason, dead_reason or None)

    @property
    def counter(self) -> str:
        """Field of the per (status, breaker) counter this entry counts in."""
        return f"{self.status}|{self.breaker}"

    @property
    def reason_counter(self) -> str:
        """Field of the per (status, reason, breaker) counter this entry counts in."""
        return f"{self.status}|{self.reason}|{self.breaker}"

    def dead(self, dead_reason: str) -> Meta:
        return Meta(self.breaker, "dead", self.reason, dead_reason)


def breaker_key(breaker: str | None) -> str:
    """The internal name of ``breaker`` (``None`` is :data:`NO_BREAKER`)."""
    return NO_BREAKER if breaker is None else breaker


def check_page(limit: int, offset: int) -> None:
    if limit < 0 or offset < 0:
        raise ValueError(f"limit and offset must be >= 0, got {limit}, {offset}")


#: Longest dead reason kept (the database store's column); the detail is cut to fit.
DEAD_REASON_MAX = 200


def dead_reason(code: str, detail: str = "") -> str:
    """``code`` (``unpublishable``...), with ``detail`` after a colon: one line, no ``|``."""
    if not detail:
        return code
    text = f"{code}: {' '.join(detail.split())}".replace("|", "/")
    return text if len(text) <= DEAD_REASON_MAX else text[: DEAD_REASON_MAX - 3] + "..."


def dead_code(reason: str | None) -> str:
    """The code of a dead reason (what precedes the detail)."""
    return (reason or "").partition(":")[0]


#: Reasons whose entries are never due: only a replay on demand sends them. A message
#: redelivered past ``resilience_max_deliveries`` most likely kills its worker: the drain must
#: not feed it to the pool again.
HELD_REASONS: tuple[Reason, ...] = ("redelivered",)


def held(reason: str) -> bool:
    """Whether entries parked for ``reason`` wait for a person (see :data:`HELD_REASONS`)."""
    return reason in HELD_REASONS


def check_dead_reason(dead_reason: str) -> None:
    if not isinstance(dead_reason, str) or not dead_reason or "|" in dead_reason:
        raise ValueError(f"dead_reason must be a non-empty str without '|', got {dead_reason!r}")


def tally_of(counters: dict[str, int]) -> dict[tuple[str, str], int]:
    """The ``status|breaker`` counters as (breaker, status) -> entries."""
    found: dict[tuple[str, str], int] = {}
    for counter, value in counters.items():
        status, _, breaker = counter.partition("|")
        if value > 0:
            found[breaker, status] = value
    return found


def count_in(counters: dict[str, int], where: Filter) -> int:
    """Sum of the ``status|breaker`` counters that match ``where``, which has no ``reason``:
    the counters are not kept per reason."""
    if where.reason is not None:
        raise ValueError("status|breaker counters can't count by reason")
    total = 0
    for counter, value in counters.items():
        status, _, breaker = counter.partition("|")
        if where.breaker in (None, breaker) and where.status in (None, status):
            total += value
    return total


def read_entry(
    entry_id: str,
    data: bytes,
    meta: Meta,
    parked_at: float,
    codec: Codec,
) -> ParkedTask:
    """The stored entry with its stored status, or the placeholder if it can't be decoded or
    trusted (its dead reason says which: ``undecodable``, ``tampered``, ``unsigned``...).

    With signing on, meta (not signed: the store's scripts rewrite it) must agree with the
    signed payload on what decides whether the drain sends it: breaker and reason.
    """
    try:
        entry = codec.decode(data, entry_id)
        if entry.id != entry_id:
            raise UndecodableEntry(f"payload belongs to entry {entry.id}")
        if codec.signer is not None and (meta.breaker, meta.reason) != (
            breaker_key(entry.breaker),
            entry.reason,
        ):
            raise Untrusted(TAMPERED, "its breaker or reason was changed beside it")
    except UndecodableEntry as exc:
        breaker = None if meta.breaker == NO_BREAKER else meta.breaker
        return undecodable(
            entry_id,
            exc,
            breaker=breaker,
            reason=meta.reason,
            parked_at=parked_at,
            due_at=parked_at,
            code=exc.code if isinstance(exc, Untrusted) else "undecodable",
        )
    if (entry.status, entry.dead_reason) != (meta.status, meta.dead_reason):
        entry = entry.replace(status=meta.status, dead_reason=meta.dead_reason)
    return entry


#: The declared base of a breaker named at call time, ``None`` for any other name (the app's
#: ``ResilienceConfig.family_of``; a store made outside an app has no derived breakers).
FamilyOf = Callable[[str], "str | None"]


def no_family(name: str) -> str | None:
    return None


def counter_scope(breaker: str, family_of: FamilyOf) -> str:
    """The breaker part of a monotonic counter's name (``parked|<b>|<reason>``...): a breaker
    named at call time counts under ``<base>:*``, so the counters stay as many as the declared
    breakers, whatever the number of hosts."""
    base = family_of(breaker)
    return breaker if base is None else f"{base}:*"
