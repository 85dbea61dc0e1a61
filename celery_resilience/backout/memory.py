"""In-process back-out store with the Redis store's contract: tests and single-process use.

It keeps encoded bytes, as Redis does, so encoding and undecodable entries behave the same.
"""

from __future__ import annotations

import builtins
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import StoreFull
from .codec import Codec
from .entry import ParkedTask
from .lifetime import Consumed, ConsumedMemory
from .reading import read_entry
from .store import (
    ANY,
    FamilyOf,
    Filter,
    Meta,
    check_dead_reason,
    check_page,
    counter_scope,
    dead_code,
    no_family,
    on_demand_only,
)


@dataclass
class _Record:
    data: bytes
    meta: Meta
    parked_at: float
    died_at: float | None = None
    due_at: float = 0.0  # the ready set's score: due time, or lease end while in flight
    lease_until: float | None = None
    held: str | None = None  # why the last drain to judge it left it parked (``hold``)


class MemoryBackoutStore:
    """A dict of records behind one lock; ``clock`` gives the time of death (dead_ttl)."""

    def __init__(
        self,
        max_entries: int = 1_000_000,
        dead_ttl: float | None = None,
        clock: Callable[[], float] = time.time,
        serializer: str = "json",
        codec: Codec | None = None,
    ) -> None:
        self.max_entries = max_entries
        self.dead_ttl = dead_ttl
        #: Breakers named at call time count under their base (``counter_scope``).
        self.family_of: FamilyOf = no_family
        self.clock = clock
        self.codec = codec or Codec(serializer)
        self.serializer = self.codec.serializer
        self._records: dict[str, _Record] = {}
        self._stats: dict[str, float] = {}
        #: What drains and replays published.
        self._consumed = ConsumedMemory()
        self._lock = threading.Lock()

    def park(self, entry: ParkedTask) -> None:
        data = self.codec.encode(entry)
        with self._lock:
            if entry.id in self._records:
                return
            if len(self._records) >= self.max_entries:
                raise StoreFull(self.max_entries, entry.id)
            died_at = self.clock() if entry.status == "dead" else None
            due_at = math.inf if on_demand_only(entry.reason) else entry.due_at
            self._records[entry.id] = _Record(
                data, Meta.of(entry), entry.parked_at, died_at, due_at=due_at
            )
            stat = f"parked|{counter_scope(Meta.of(entry).breaker, self.family_of)}|{entry.reason}"
            self._stats[stat] = self._stats.get(stat, 0) + 1

    def get(self, entry_id: str) -> ParkedTask | None:
        with self._lock:
            record = self._records.get(entry_id)
        return None if record is None else self._read(entry_id, record)

    def entries(self, entry_ids: Sequence[str]) -> builtins.list[ParkedTask]:
        with self._lock:
            found = [(i, r) for i in entry_ids if (r := self._records.get(i)) is not None]
        return [self._read(i, r) for i, r in found]

    def count(self, where: Filter = ANY) -> int:
        with self._lock:
            return sum(1 for r in self._records.values() if where.matches(r.meta))

    def tally(self) -> dict[tuple[str, str], int]:
        found: dict[tuple[str, str], int] = {}
        with self._lock:
            for record in self._records.values():
                key = (record.meta.breaker, record.meta.status)
                found[key] = found.get(key, 0) + 1
        return found

    def with_prefix(self, prefix: str, limit: int = 20) -> builtins.list[ParkedTask]:
        return self._newest_where(lambda i, e: bool(prefix) and i.startswith(prefix), limit)

    def with_task_id(self, task_id: str, limit: int = 20) -> builtins.list[ParkedTask]:
        return self._newest_where(lambda i, e: e.task_id == task_id, limit)

    def _newest_where(
        self, test: Callable[[str, ParkedTask], bool], limit: int
    ) -> builtins.list[ParkedTask]:
        with self._lock:
            records = sorted(
                self._records.items(), key=lambda item: (item[1].parked_at, item[0]), reverse=True
            )
        found = [e for i, r in records if test(i, e := self._read(i, r))]
        return found[:limit]

    def dead_by_reason(self) -> dict[str, int]:
        with self._lock:
            metas = [r.meta for r in self._records.values()]
        return dict(Counter(dead_code(m.dead_reason) for m in metas if m.status == "dead"))

    def held_entries(self) -> dict[str, tuple[int, float]]:
        found: dict[str, tuple[int, float]] = {}
        with self._lock:
            for record in self._records.values():
                if record.held is not None:
                    count, oldest = found.get(record.held, (0, math.inf))
                    found[record.held] = (count + 1, min(oldest, record.parked_at))
        return found

    def oldest_parked(self) -> float | None:
        with self._lock:
            times = [r.parked_at for r in self._records.values() if r.meta.status == "parked"]
        return min(times, default=None)

    def list(
        self, where: Filter = ANY, limit: int = 100, offset: int = 0
    ) -> builtins.list[ParkedTask]:
        check_page(limit, offset)
        with self._lock:
            chosen = [
                (entry_id, record)
                for entry_id, record in self._records.items()
                if where.matches(record.meta)
            ]
        # Redis's order: score descending, then id descending.
        chosen.sort(key=lambda item: (item[1].parked_at, item[0]), reverse=True)
        return [self._read(i, r) for i, r in chosen[offset : offset + limit]]

    def delete(self, entry_id: str) -> bool:
        with self._lock:
            return self._records.pop(entry_id, None) is not None

    def purge(self, where: Filter = ANY, progress: Callable[[int], None] | None = None) -> int:
        with self._lock:
            doomed = [i for i, r in self._records.items() if where.matches(r.meta)]
            for entry_id in doomed:
                del self._records[entry_id]
        if progress is not None and doomed:
            progress(len(doomed))
        return len(doomed)

    def breakers(self) -> set[str]:
        with self._lock:
            return {r.meta.breaker for r in self._records.values()}

    def mark_dead(self, entry_id: str, dead_reason: str) -> bool:
        check_dead_reason(dead_reason)
        with self._lock:
            record = self._records.get(entry_id)
            if record is None or record.meta.status == "dead":
                return False
            record.meta = record.meta.dead(dead_reason)
            record.died_at, record.held = self.clock(), None
            return True

    def revive(self, entry_id: str, dead_reason: str, due_at: float) -> bool:
        with self._lock:
            record = self._records.get(entry_id)
            meta = None if record is None else record.meta
            if record is None or meta is None or meta.status != "dead":
                return False
            if meta.dead_reason != dead_reason:
                return False
            record.meta = Meta(meta.breaker, "parked", meta.reason)
            record.died_at, record.lease_until = None, None
            record.due_at = math.inf if on_demand_only(meta.reason) else due_at
            return True

    def expire_dead(self) -> int:
        if self.dead_ttl is None:
            return 0
        with self._lock:
            cutoff = self.clock() - self.dead_ttl
            doomed = [
                i for i, r in self._records.items() if r.died_at is not None and r.died_at <= cutoff
            ]
            for entry_id in doomed:
                del self._records[entry_id]
        return len(doomed)

    def payloads(self, after: str, limit: int) -> tuple[str, builtins.list[tuple[str, bytes]]]:
        check_page(limit, 0)
        with self._lock:  # by entry id: ids never change, so no entry is passed over
            page = sorted((i, r.data) for i, r in self._records.items() if i > after)[:limit]
        return (page[-1][0] if len(page) == limit and limit else ""), page

    def payload(self, entry_id: str) -> bytes | None:
        with self._lock:
            record = self._records.get(entry_id)
        return None if record is None else record.data

    def rewrite(self, entry_id: str, old: bytes, new: bytes) -> bool:
        with self._lock:
            record = self._records.get(entry_id)
            if record is None or record.data != old:
                return False
            record.data = new
            return True

    def stats(self) -> dict[str, float]:
        with self._lock:
            return dict(self._stats)

    def bump(self, counters: dict[str, float]) -> None:
        with self._lock:
            for name, amount in counters.items():
                self._stats[name] = self._stats.get(name, 0) + amount

    # -- the drain's side ----------------------------------------------------------------

    def claim(
        self, breaker: str, limit: int, lease: float, now: float | None = None
    ) -> builtins.list[ParkedTask]:
        now = self.clock() if now is None else now
        with self._lock:
            due = sorted(
                (r.due_at, i)
                for i, r in self._records.items()
                if r.meta.breaker == breaker and r.meta.status == "parked" and r.due_at <= now
            )[: max(0, limit)]
            for _, entry_id in due:
                record = self._records[entry_id]
                record.due_at = record.lease_until = now + lease
            return [self._read(i, self._records[i]) for _, i in due]

    def ack(self, breaker: str, entry_ids: Sequence[str], consumed: Sequence[Consumed] = ()) -> int:
        with self._lock:
            self._consumed.remember(consumed, self.clock())
            return sum(1 for i in entry_ids if self._records.pop(i, None) is not None)

    def forget_consumed(self) -> int:
        with self._lock:
            return self._consumed.forget(self.clock())

    def consumed(self, entry_ids: Sequence[str]) -> dict[str, float]:
        with self._lock:
            return self._consumed.of(entry_ids)

    def give_back(self, breaker: str, entry_ids: Sequence[str], due_at: float) -> int:
        return self._give_back(entry_ids, due_at, None)

    def release(self, breaker: str, entry_ids: Sequence[str], due_at: float) -> int:
        """Deprecated alias of :meth:`give_back`: ``release`` names a permit's end (see the
        design page's glossary)."""
        return self.give_back(breaker, entry_ids, due_at)

    def hold(self, breaker: str, entry_ids: Sequence[str], code: str, due_at: float) -> int:
        return self._give_back(entry_ids, due_at, code)

    def _give_back(self, entry_ids: Sequence[str], due_at: float, held: str | None) -> int:
        released = 0
        with self._lock:
            for entry_id in entry_ids:
                record = self._records.get(entry_id)
                if record is not None and record.lease_until is not None:
                    record.due_at, record.lease_until, record.held = due_at, None, held
                    released += 1
        return released

    def in_flight(self) -> int:
        now = self.clock()
        with self._lock:
            return sum(1 for r in self._records.values() if (r.lease_until or 0) > now)

    def due(self, breaker: str, now: float | None = None) -> int:
        now = self.clock() if now is None else now
        with self._lock:
            return sum(
                1
                for r in self._records.values()
                if r.meta.breaker == breaker and r.meta.status == "parked" and r.due_at <= now
            )

    def _read(self, entry_id: str, record: _Record) -> ParkedTask:
        return read_entry(entry_id, record.data, record.meta, record.parked_at, self.codec)
