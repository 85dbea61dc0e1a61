"""Counts by reason in the Redis back-out store: O(1) from counters, exact or not used at all.

``reasons`` holds ``status|reason|<b>`` counters of the entries whose ``parked_at`` is at most
its ``~counted`` field (every entry once that is ``all``). Each script that adds, removes or
changes an entry keeps that true for its entry, in the same atomic step; ``backfill.lua`` moves
``~counted`` forward over the index a batch at a time (a store parked into before these counters
existed, or one whose counters were found wrong), counting each entry as it is at that moment.
So an entry is in the counters once, whichever script reaches it first.

A count trusts the counters only when ``reason_counts.lua`` finds them complete and in
agreement with what every release keeps (the ``counts`` hash, the parks in ``stats``): a worker
of an older release changes entries without them, and is seen. Otherwise the count backfills
(once per store object, so a store that keeps drifting costs a scan, no more), and scans the
metadata as a last resort.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import redis

from ...redis_io import load_script, unavailable
from ..store import Filter, Meta
from .keys import BackoutKeys

#: Entries counted per backfill call: a few milliseconds of Redis each.
BACKFILL_BATCH = 1000
_PAGE = 500


class ReasonCounts:
    """The counts by reason of one Redis back-out store (its ``reasons`` hash and two scripts)."""

    def __init__(self, client: redis.Redis, keys: BackoutKeys) -> None:
        self.client = client
        self.keys = keys
        self._backfill = load_script(client, __package__, "backfill")
        self._reason_counts = load_script(client, __package__, "reason_counts")
        #: Whether this object has backfilled since it found the counters wrong (then it scans).
        self._refilled = False

    def counters(self) -> dict[str, int] | None:
        """The ``status|reason|<b>`` counters if they are complete and agree, else ``None``."""
        with unavailable("back-out store"):
            k = self.keys
            reply = self._reason_counts([k.counts, k.reasons, k.stats])
        state = reply[0].decode()
        if state != "ok":
            return None
        return {reply[i].decode(): int(reply[i + 1]) for i in range(1, len(reply), 2)}

    def backfill(
        self,
        reset: bool = False,
        batch: int = BACKFILL_BATCH,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Count by reason every entry the counters miss, ``batch`` at a time (each batch one
        script); ``reset``: forget them and count every entry again. The entries counted."""
        with unavailable("back-out store"):
            return self._backfill_all(reset, batch, progress)

    def _backfill_all(
        self, reset: bool, batch: int, progress: Callable[[int], None] | None = None
    ) -> int:
        k = self.keys
        keys = [k.index, k.meta, k.reasons, k.stats]
        total, flag = 0, "reset" if reset else ""
        while True:
            counted, done = (int(n) for n in self._backfill(keys, [batch, flag]))
            flag = ""
            total += counted
            if progress is not None and counted:
                progress(counted)
            if done:
                return total

    def count(self, where: Filter) -> int:
        """Entries that match ``where`` (a filter by reason): from the counters, backfilled
        first if they are not complete, or by reading every entry's meta if they can't be."""
        counters = self.counters()
        if counters is None:
            counters = self._refill()
        if counters is None:  # an older release writes beside this one: read every entry
            return self.scan_count(where)
        return total_of(counters, where)

    def scan_count(self, where: Filter) -> int:
        """Read every entry's meta (HSCAN may return a field twice, hence the set)."""
        with unavailable("back-out store"):
            scan = self.client.hscan_iter(self.keys.meta, count=_PAGE)
            return len({i for i, m in scan if where.matches(Meta.decode(m))})

    def _refill(self) -> dict[str, int] | None:
        """Backfill (again, from nothing, if the counters were complete but wrong), once."""
        with unavailable("back-out store"):
            k = self.keys
            state = self._reason_counts([k.counts, k.reasons, k.stats])[0].decode()
        if state == "drift":
            if self._refilled:
                return None
            self._refilled = True
        with unavailable("back-out store"):
            try:
                self._backfill_all(state == "drift", BACKFILL_BATCH)
            except redis.ResponseError:  # a user without the rights to write: scan instead
                return None
        return self.counters()


def total_of(counters: dict[str, int], where: Filter) -> int:
    """Sum of the ``status|reason|<b>`` counters that match ``where``."""
    return sum(n for field, n in counters.items() if where.matches(_meta_of(field)))


def _meta_of(field: str) -> Meta:
    """The meta a ``status|reason|<b>`` counter stands for, read as ``Meta.decode`` reads meta
    (so the counters and the scan agree on metadata no release wrote)."""
    status, reason, breaker = cast(tuple[str, str, str], tuple(field.split("|", 2)))
    return Meta.decode(f"{status}|{reason}||{breaker}")
