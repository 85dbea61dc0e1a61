"""The database store's memory of the entries a drain or a replay published (the
``ConsumedEntry`` table): written in the ack's transaction, so an ack lost is neither.

Each id keeps the latest park time and the latest end of life it was remembered with: a person
sending an older copy again by hand never makes a later one look new.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ...backout.lifetime import Consumed
from .statements import chunks


class ConsumedRows:
    """The remembered entries of the ``model`` table in database ``using``."""

    def __init__(self, model: Any, using: str) -> None:
        self.model = model
        self.using = using

    def _rows(self) -> Any:
        return self.model.objects.using(self.using)

    def remember(self, consumed: Sequence[Consumed]) -> None:
        """Remember ``consumed``, then forget whatever's time is up (inside the caller's
        transaction)."""
        ids = [c.entry_id for c in consumed]
        known = {
            pk: (parked, until)
            for chunk in chunks(ids)
            for pk, parked, until in self._rows()
            .filter(pk__in=chunk)
            .values_list("pk", "parked_at", "until")
        }
        rows = []
        for c in consumed:
            parked, until = known.get(c.entry_id, (c.parked_at, c.until))
            rows.append(
                self.model(
                    id=c.entry_id, parked_at=max(parked, c.parked_at), until=max(until, c.until)
                )
            )
        self._rows().bulk_create(
            rows, update_conflicts=True, unique_fields=["id"], update_fields=["parked_at", "until"]
        )
        self.forget()

    def forget(self) -> int:
        """Forget every remembered entry whose time is up (this host's clock: see the store)."""
        return int(self._rows().filter(until__lte=time.time()).delete()[0])

    def of(self, entry_ids: Sequence[str]) -> dict[str, float]:
        """The remembered park time of each of ``entry_ids`` remembered."""
        return {
            str(i): float(p)
            for chunk in chunks(entry_ids)
            for i, p in self._rows().filter(pk__in=chunk).values_list("id", "parked_at")
        }
