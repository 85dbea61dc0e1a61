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

from .entry import REASONS, STATUSES, ParkedTask, Reason, Status
from .lifetime import Consumed

#: Internal breaker name of entries parked without a breaker. ``ParkedTask.breaker`` reports
#: them as ``None``; ``breakers()`` lists the group as ``NO_BREAKER`` and the ``breaker`` filter
#: of ``count``/``list``/``purge`` accepts it (``breaker=None`` there means "any breaker").
NO_BREAKER = "-"
#: Dead reason of an entry whose metadata this release can't read.
UNREADABLE_META = "unreadable_meta"


@dataclass(frozen=True)
class Filter:
    """Which entries ``count``, ``list`` and ``purge`` mean; a field left ``None`` matches any.

    One value instead of loose ``breaker, status, reason`` arguments, which could be taken in
    different orders by the public ``Backout.list(breaker, status, limit, ...)`` and the store,
    and a string passed in the wrong place would type-check. ``breaker`` is a breaker name
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

    def entries(self, entry_ids: Sequence[str]) -> builtins.list[ParkedTask]:
        """The entries of ``entry_ids`` that exist, in that order, read as ``get`` reads them, in
        one go."""

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

    def dead_by_reason(self) -> dict[str, int]:
        """Dead entries by the code of their dead reason (``replayed``, ``tampered``...), read
        from every dead entry's metadata (a scan: for ``check``, not for every scrape)."""

    def held_entries(self) -> dict[str, tuple[int, float]]:
        """Entries the drain left parked for a process that can read them (:meth:`Claims.hold`),
        by the reason they are held for: how many, and the oldest one's ``parked_at``."""

    def oldest_parked(self) -> float | None:
        """``parked_at`` of the oldest entry still ``parked`` (dead ones wait for a person, not
        for the drain); ``None`` when none is, or when more than :data:`OLDEST_SCAN` dead
        entries are older than every parked one (a scrape must stay cheap)."""

    def mark_dead(self, entry_id: str, dead_reason: str) -> bool:
        """Move a parked entry to dead (out of the ready set); ``False`` if absent or dead."""

    def revive(self, entry_id: str, dead_reason: str, due_at: float) -> bool:
        """Park a dead entry again, due at ``due_at``, if it is still dead for ``dead_reason``
        (a person's repair of an entry that reads and verifies now); whether it did."""

    def expire_dead(self) -> int:
        """Remove entries dead for longer than ``dead_ttl`` (none when unset); the number."""

    def payloads(self, after: str, limit: int) -> tuple[str, builtins.list[tuple[str, bytes]]]:
        """Stored bytes of about ``limit`` entries from position ``after`` (``""``: the start),
        and the position of the next page (``""``: every entry was seen). Every entry that
        exists from the first page to the last is in one of them (some may come twice),
        whatever is parked, drained or deleted meanwhile: the key rotation walks the store so.
        """

    def payload(self, entry_id: str) -> bytes | None:
        """The stored bytes of one entry, ``None`` if absent."""

    def rewrite(self, entry_id: str, old: bytes, new: bytes) -> bool:
        """Replace an entry's bytes with ``new`` if they still are ``old``; whether it did."""


class Claims(Protocol):
    """The drain's side of a store: lease due entries, then ack or give them back."""

    def claim(
        self, breaker: str, limit: int, lease: float, now: float | None = None
    ) -> builtins.list[ParkedTask]:
        """Lease up to ``limit`` due entries of ``breaker`` to the caller (the drain).

        Until acked or given back they are not due; if the caller dies, they are due again when
        the lease ends. Undecodable ones come back as placeholders (``dead_reason`` set).
        """

    def ack(self, breaker: str, entry_ids: Sequence[str], consumed: Sequence[Consumed] = ()) -> int:
        """Remove claimed entries of ``breaker`` once they were published; the number removed.
        ``consumed``: what to remember of them, in the same atomic step (see :class:`Consumed`),
        whatever ``entry_ids`` holds (an empty one too); and, as ``forget_consumed`` does, at
        least as many remembered entries whose time is up are forgotten.
        """

    def consumed(self, entry_ids: Sequence[str]) -> dict[str, float]:
        """The signed ``parked_at`` of each of ``entry_ids`` that a drain or a replay consumed
        and still remembers."""

    def forget_consumed(self) -> int:
        """Forget every remembered entry whose time is up; the number forgotten. It writes
        what an ack writes: the drain and a replay call it first, so that a process that may
        not write it is refused before it publishes anything."""

    def give_back(self, breaker: str, entry_ids: Sequence[str], due_at: float) -> int:
        """Give claimed entries back unreplayed, due again at ``due_at``; the number given back.
        They were read here: no longer held (:meth:`hold`)."""

    def release(self, breaker: str, entry_ids: Sequence[str], due_at: float) -> int:
        """Deprecated alias of :meth:`give_back`: ``release`` names a permit's end (see the
        design page's glossary)."""

    def hold(self, breaker: str, entry_ids: Sequence[str], code: str, due_at: float) -> int:
        """Give claimed entries back, due again at ``due_at``, held for ``code`` (``unknown_key``,
        ``newer_format``: this process can't read them, another may). They count in
        :meth:`EntryStore.held_entries` until a drain reads them or they are deleted or dead."""

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
    #: Why this release can't read the status or reason (a newer release's value): the entry
    #: is held, for a process that reads it, never judged here.
    newer: str | None = None

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
            # Written by a newer release (or by hand): held, never judged, never published here.
            return cls(
                breaker,
                status if status in STATUSES else "parked",
                reason if reason in REASONS else "park_on",
                dead_reason or None,
                newer=f"its status or reason ({status}, {reason}) is unknown to this release",
            )
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
ON_DEMAND_REASONS: tuple[Reason, ...] = ("redelivered",)


def on_demand_only(reason: str) -> bool:
    """Whether entries parked for ``reason`` wait for a person (see :data:`ON_DEMAND_REASONS`)."""
    return reason in ON_DEMAND_REASONS


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
