"""The drain's side of the database store: claims under a lease, give-backs, what is due and
what is held.

A claimed row keeps ``due_at`` and ``lease_until`` at the lease's end: a drainer that dies
before it acks leaves it due again then. Claims select due rows ``FOR UPDATE SKIP LOCKED``
where the database has it, so two drainers never claim one row; elsewhere (SQLite) they take
the ``lock|claim`` row first.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from django.db import connections, transaction

from ...backout.store import ON_DEMAND_REASONS
from .stat_rows import StatRows
from .statements import chunks, reachable

#: The columns an entry is read from (``DjangoBackoutStore._read``), in this order.
COLUMNS = ("id", "payload", "breaker", "status", "reason", "dead_reason", "parked_at")


class Leases:
    """Claims and give-backs of the ``model`` table in database ``using``."""

    def __init__(self, model: Any, using: str, stats: StatRows) -> None:
        self.model = model
        self.using = using
        self.stats = stats

    def _rows(self) -> Any:
        return self.model.objects.using(self.using)

    def claim(
        self, breaker: str, limit: int, lease: float, now: float | None = None
    ) -> list[tuple[Any, ...]]:
        """Lease up to ``limit`` due rows of ``breaker``; their ``COLUMNS``."""
        if limit <= 0:
            return []
        now = time.time() if now is None else now
        features = connections[self.using].features
        with reachable(), transaction.atomic(using=self.using):
            if not features.has_select_for_update_skip_locked:
                self.stats.lock("claim")
            due = self._due(breaker, now).order_by("due_at", "id")
            if features.has_select_for_update:
                skip = features.has_select_for_update_skip_locked
                due = due.select_for_update(skip_locked=skip)
            rows = list(due.values_list(*COLUMNS)[:limit])
            for chunk in chunks([row[0] for row in rows]):
                self._rows().filter(pk__in=chunk).update(
                    due_at=now + lease, lease_until=now + lease
                )
        return rows

    def give_back(self, entry_ids: Sequence[str], due_at: float, held: str | None) -> int:
        """Give claimed rows back, due again at ``due_at``, held for ``held`` (or no longer)."""
        with reachable():
            return sum(
                self._rows()
                .filter(pk__in=chunk, lease_until__isnull=False)
                .update(due_at=due_at, lease_until=None, held=held)
                for chunk in chunks(entry_ids)
            )

    def held(self) -> dict[str, tuple[int, float]]:
        """Parked rows held, by reason: how many, and the oldest ``parked_at``."""
        from django.db.models import Count, Min

        with reachable():
            rows = (
                self._rows()
                .filter(held__isnull=False, status="parked")
                .values_list("held")
                .annotate(n=Count("pk"), oldest=Min("parked_at"))
                .order_by()
            )
            return {str(code): (int(n), float(oldest)) for code, n, oldest in rows}

    def in_flight(self) -> int:
        with reachable():
            return int(self._rows().filter(lease_until__gt=time.time()).count())

    def due(self, breaker: str, now: float | None = None) -> int:
        with reachable():
            return int(self._due(breaker, time.time() if now is None else now).count())

    def _due(self, breaker: str, now: float) -> Any:
        due = self._rows().filter(breaker=breaker, status="parked", due_at__lte=now)
        return due.exclude(reason__in=ON_DEMAND_REASONS)
