"""The Django back-out store's counters and lock rows, in the ``ResilienceStat`` table.

A counter is a row (``name`` -> ``value``); a park's counter is spread over ``STAT_SHARDS`` rows
picked at random, so concurrent parks never queue behind one hot row, and ``totals`` adds them
up. A lock is a row too: writing it holds it until the transaction ends (SQLite's claims).
"""

from __future__ import annotations

import random
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F

#: Stat rows with this prefix are locks, not counters: ``totals()`` leaves them out.
LOCK_PREFIX = "lock|"
#: Rows a park's counter is spread over (``shard|<k>|<name>`` for k > 0); ``totals()`` adds them.
STAT_SHARDS = 16
SHARD_PREFIX = "shard|"


class StatRows:
    """Counters and lock rows of the ``model`` table in database ``using``."""

    def __init__(self, model: Any, using: str) -> None:
        self.model = model
        self.using = using

    def add(self, name: str, amount: float) -> None:
        """Add to a counter row (UPDATE first: that write is also what locks the row)."""
        stats = self.model.objects.using(self.using)
        if stats.filter(name=name).update(value=F("value") + amount):
            return
        try:
            with transaction.atomic(using=self.using):
                stats.create(name=name, value=amount)
        except IntegrityError:  # made meanwhile by another process: add to that one
            stats.filter(name=name).update(value=F("value") + amount)

    def add_spread(self, name: str, amount: float) -> None:
        """Add to one of the counter's ``STAT_SHARDS`` rows, picked at random (a park's)."""
        self.add(_shard(name, random.randrange(STAT_SHARDS)), amount)

    def lock(self, name: str) -> None:
        """Hold the lock row ``name`` until the transaction ends."""
        self.add(LOCK_PREFIX + name, 1)

    def totals(self) -> dict[str, float]:
        """Every counter, its shards added up; the lock rows left out."""
        rows = self.model.objects.using(self.using).values_list("name", "value")
        totals: dict[str, float] = {}
        for row, value in rows:
            if row.startswith(LOCK_PREFIX):
                continue
            name = row.split("|", 2)[2] if row.startswith(SHARD_PREFIX) else row
            totals[name] = totals.get(name, 0.0) + float(value)
        return totals


def _shard(name: str, shard: int) -> str:
    """The row of counter ``name`` in shard ``shard`` (shard 0 is the counter's own row)."""
    return f"{SHARD_PREFIX}{shard}|{name}" if shard else name
