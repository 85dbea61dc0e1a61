"""The drain's side of the Django back-out store: claim under a lease, ack after publish.

A claimed row stays in the table with ``due_at`` and ``lease_until`` moved to the lease's end:
if the drainer dies before it acks, the row is simply due again when the lease ends. Also
here, because both sides use them: :func:`reachable` and the columns an entry is read from.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from django.db import InterfaceError, OperationalError, connections, transaction

from ...errors import StoreUnavailable
from ...parked.entry import ParkedTask
from ...parked.store import HELD_REASONS

#: The columns an entry is read from (``DjangoBackoutStore._read``), in this order.
COLUMNS = ("id", "payload", "breaker", "status", "reason", "dead_reason", "parked_at")
#: Ids per statement in ``ack``/``release`` (well under every backend's parameter limit).
_CHUNK = 500


@contextmanager
def reachable() -> Iterator[None]:
    """Connection trouble becomes ``StoreUnavailable``: parking then keeps the message."""
    try:
        yield
    except (OperationalError, InterfaceError) as exc:
        raise StoreUnavailable(f"back-out store unreachable: {exc}") from exc


class DjangoClaims:
    """Mixed into ``DjangoBackoutStore``, which provides the attributes declared here."""

    using: str

    def _rows(self) -> Any:
        raise NotImplementedError

    def _lock(self, name: str) -> None:
        raise NotImplementedError

    def _read(self, row: tuple[Any, ...]) -> ParkedTask:
        raise NotImplementedError

    def claim(
        self, breaker: str, limit: int, lease: float, now: float | None = None
    ) -> builtins.list[ParkedTask]:
        """Lease up to ``limit`` due entries of ``breaker`` (internal name) to the caller."""
        if limit <= 0:
            return []
        now = time.time() if now is None else now
        features = connections[self.using].features
        with reachable(), transaction.atomic(using=self.using):
            if not features.has_select_for_update_skip_locked:
                self._lock("claim")
            due = self._due(breaker, now).order_by("due_at", "id")
            if features.has_select_for_update:
                skip = features.has_select_for_update_skip_locked
                due = due.select_for_update(skip_locked=skip)
            rows = list(due.values_list(*COLUMNS)[:limit])
            for chunk in _chunks([row[0] for row in rows]):
                self._rows().filter(pk__in=chunk).update(
                    due_at=now + lease, lease_until=now + lease
                )
        return [self._read(row) for row in rows]

    def ack(self, breaker: str, entry_ids: Sequence[str]) -> int:
        """Remove entries that were published (the end of a claim)."""
        with reachable():
            return sum(self._rows().filter(pk__in=c).delete()[0] for c in _chunks(entry_ids))

    def release(self, breaker: str, entry_ids: Sequence[str], due_at: float) -> int:
        """Give claimed entries back, due again at ``due_at``; ``breaker`` is not needed here."""
        with reachable():
            return sum(
                self._rows()
                .filter(pk__in=chunk, lease_until__isnull=False)
                .update(due_at=due_at, lease_until=None)
                for chunk in _chunks(entry_ids)
            )

    def in_flight(self) -> int:
        with reachable():
            return int(self._rows().filter(lease_until__gt=time.time()).count())

    def due(self, breaker: str, now: float | None = None) -> int:
        with reachable():
            return int(self._due(breaker, time.time() if now is None else now).count())

    def _due(self, breaker: str, now: float) -> Any:
        due = self._rows().filter(breaker=breaker, status="parked", due_at__lte=now)
        return due.exclude(reason__in=HELD_REASONS)


def _chunks(ids: Sequence[str]) -> Iterator[builtins.list[str]]:
    """``ids`` in lists small enough for one statement on every backend."""
    for start in range(0, len(ids), _CHUNK):
        yield list(ids[start : start + _CHUNK])
