"""An entry's signed lifetime, and the drain's memory of the entries it consumed.

A lifetime starts when the entry is due (its park time, or later for a retry parked until it
is due) and lasts ``resilience_entry_lifetime``: an entry is never stale before it was due.
Every time is Redis's (an entry's park and due times are). A drain or a replay remembers each
entry it published until that entry's lifetime ends: a copy written back within it is refused
as ``replayed``, one written back later as ``stale``. So a lifetime may be renewed only while
the memory still answers for it (:func:`renewed`): one that ended is never extended, since a
copy of a consumed entry can then no longer be told from the entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .entry import ParkedTask

#: Dead reason of a copy of an entry already published, written back into the store.
REPLAYED = "replayed"


def lifetime_end(entry: ParkedTask, now: float, lifetime: float) -> float:
    """When a lifetime of ``entry`` that starts ``now`` (or when it is due, if later) ends."""
    return max(now, entry.parked_at, entry.due_at) + lifetime


def renewed(
    entry: ParkedTask,
    now: float,
    lifetime: float,
    consumed: dict[str, float],
    vouched: bool = False,
) -> float | None:
    """The lifetime's end of ``entry`` signed again ``now`` (rotated, repaired): a fresh one,
    unless the memory names it a copy (``consumed``: :meth:`Claims.consumed` of its id) or its
    lifetime already ended (kept as it is, for the drain to judge) and no person vouched for
    it (``vouched``: ``repair --past-lifetime``). An entry written before lifetimes were signed
    gets one."""
    fresh = lifetime_end(entry, now, lifetime)
    if entry.expires_at is None:
        return fresh
    if replayed_copy(entry, consumed) or (entry.expires_at <= now and not vouched):
        return entry.expires_at
    return max(entry.expires_at, fresh)


@dataclass(frozen=True)
class Consumed:
    """What the store remembers of an entry that was published: its id, its signed park time
    (a copy of it written back has no later one; a new park of the same message has) and until
    when (its signed lifetime's end: past it, a copy is refused as ``stale`` anyway)."""

    entry_id: str
    parked_at: float
    until: float

    @classmethod
    def of(cls, entry: ParkedTask, now: float, lifetime: float) -> Consumed:
        until = entry.expires_at if entry.expires_at is not None else now + lifetime
        return cls(entry.id, entry.parked_at, max(until, now))


def replayed_copy(entry: ParkedTask, consumed: dict[str, float]) -> bool:
    """Whether ``entry`` is a copy of one already consumed: parked no later than it. A message
    parked again after its entry was drained (a redelivery) has a later park time: not a copy."""
    parked = consumed.get(entry.id)
    return parked is not None and entry.parked_at <= parked


class ConsumedMemory:
    """The memory of consumed entries in one process (the memory store's; the others keep it in
    Redis or a table): each id keeps the latest park time and end of life it was given, so
    that sending an older copy again by hand never makes a later one look new."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[float, float]] = {}  # id -> (parked_at, until)

    def remember(self, consumed: Sequence[Consumed], now: float) -> None:
        """Remember ``consumed``, then forget what is past ``now``."""
        for c in consumed:
            parked, until = self._kept.get(c.entry_id, (c.parked_at, c.until))
            self._kept[c.entry_id] = (max(parked, c.parked_at), max(until, c.until))
        self.forget(now)

    def forget(self, now: float) -> int:
        """Forget every entry remembered until ``now`` or before; the number forgotten."""
        doomed = [i for i, (_, until) in self._kept.items() if until <= now]
        for entry_id in doomed:
            del self._kept[entry_id]
        return len(doomed)

    def of(self, entry_ids: Sequence[str]) -> dict[str, float]:
        """The remembered park time of each of ``entry_ids`` remembered."""
        return {i: self._kept[i][0] for i in entry_ids if i in self._kept}
