"""The back-out store as an app sees it (``Resilience.for_app(app).backout``).

The store itself only keeps entries; replaying one needs the app to publish it, so this thin
view adds ``replay`` and passes everything else through.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import cast

from .entry import ParkedTask, Reason, Status
from .store import BackoutStore, Filter


class Backout:
    """Look at, replay and remove parked tasks."""

    def __init__(self, store: BackoutStore, replay: Callable[[str], ParkedTask]) -> None:
        self.store = store
        self._replay = replay

    def count(self, breaker: str | None = None, status: str | None = None) -> int:
        """Entries (parked and dead unless ``status`` says which), of one breaker or all."""
        return self.store.count(_where(breaker, status))

    def list(
        self,
        breaker: str | None = None,
        status: str | None = None,
        limit: int = 100,
        *,
        reason: str | None = None,
        offset: int = 0,
    ) -> builtins.list[ParkedTask]:
        """Entries, newest first; ``reason`` filters, ``offset`` pages."""
        return self.store.list(_where(breaker, status, reason), limit, offset)

    def get(self, entry_id: str) -> ParkedTask | None:
        """One entry, or ``None``; an undecodable one comes back as a dead placeholder."""
        return self.store.get(entry_id)

    def replay(self, entry_id: str) -> ParkedTask:
        """Publish the entry now with its task id, whatever the breaker says; then remove it.

        ``EntryNotFound`` (a ``KeyError``) if absent, ``NotReplayable`` (a ``ValueError``) saying
        why a worker would refuse it, ``DrainBusy`` (a ``TimeoutError``) if a drain kept its lock.
        """
        return self._replay(entry_id)

    def delete(self, entry_id: str) -> bool:
        """Remove one entry for good; ``False`` if it was not there."""
        return self.store.delete(entry_id)

    def purge(
        self,
        breaker: str | None = None,
        status: str | None = None,
        reason: str | None = None,
        *,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Remove every matching entry (all of them without filters); the number removed.

        It goes in batches, each atomic: ``progress(n)`` is called after each batch of n."""
        return self.store.purge(_where(breaker, status, reason), progress)

    def breakers(self) -> set[str]:
        """Breakers that have entries (``"-"`` for tasks without one)."""
        return self.store.breakers()

    def stats(self) -> dict[str, float]:
        """Monotonic counters: parks by breaker and reason, replays, drain runs and time."""
        return self.store.stats()


def _where(breaker: str | None, status: str | None, reason: str | None = None) -> Filter:
    """The store's filter of this view's loose arguments (the casts hold: ``Filter`` checks
    ``status`` and ``reason`` when made, and refuses ones that can never match)."""
    return Filter(breaker, cast("Status | None", status), cast("Reason | None", reason))
