"""Whether the database store has room for one more entry, without a lock or a full count.

One lock row and a ``COUNT(*)`` of the table per park would be exact, but every park in the
fleet would wait for the one before it, and the count grows with the table (tens of
milliseconds at a million rows). So:

- under a limit of ``EXACT_BELOW`` entries or more, far from it (PostgreSQL's estimate of the
  table's rows below ``SURE_BELOW`` of ``max_entries``), a park counts nothing: the estimate is
  the planner's own (``reltuples`` per page at the last ``ANALYZE``, times the table's pages
  now), one catalog read;
- nearer, under a smaller limit (where the estimate's error is a good part of the limit and a
  count is quick) or on a database without the estimate, it uses an exact ``COUNT(*)`` that
  this process made at most ``COUNT_TTL`` seconds ago, plus the parks this process admitted
  since.

So a store near its limit may pass it by what *other* processes parked in the last
``COUNT_TTL`` seconds (a fleet parking 300 a second: some 300 entries over a limit of
1,000,000); one process alone, whatever its threads, never passes it. The estimate errs on the
safe side when rows were deleted and not yet vacuumed; it is low only when entries became much
smaller since the last ``ANALYZE``, and then by the margin (10 %) before it matters.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .estimates import EXACT_BELOW, estimated_rows

#: Below this fraction of ``max_entries`` by the estimate, a park counts nothing.
SURE_BELOW = 0.9
#: Seconds an exact count stands in for the table (with this process's own parks added).
COUNT_TTL = 1.0


class Room:
    """The full-store check of one store object (shared by its threads)."""

    def __init__(self, model: Any, using: str, limit: int) -> None:
        self.model, self.using, self.limit = model, using, limit
        self._lock = threading.Lock()
        self._counted_at = -float("inf")  # time.monotonic() of the last exact count
        self._known = 0  # that count, plus the parks admitted since

    def take(self) -> bool | None:
        """Admit one more entry? ``None``: the store is full; ``True``: admitted on the count,
        so ``refund`` is owed if it stores nothing after all; ``False``: on the estimate."""
        if self.limit >= EXACT_BELOW:
            estimate = estimated_rows(self.model, self.using)
            if estimate is not None and estimate < self.limit * SURE_BELOW:
                return False
        with self._lock:
            if time.monotonic() - self._counted_at > COUNT_TTL:
                self._known = self.model.objects.using(self.using).count()
                self._counted_at = time.monotonic()
            if self._known >= self.limit:
                return None
            self._known += 1
            return True

    def refund(self) -> None:
        """A park admitted on the count stored nothing (it was there already, or it failed)."""
        with self._lock:
            self._known = max(0, self._known - 1)

    def forget(self) -> None:
        """Entries were removed: count again at the next park near the limit."""
        with self._lock:
            self._counted_at = -float("inf")
