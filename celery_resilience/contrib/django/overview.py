"""What the overview page reads: parked tasks per breaker and reason, the oldest one, the
drain and beat, the breakers by state. Each a few reads, none a row.

Per breaker and reason: the database store groups its table in one query; the Redis store reads
its reason counters (one script), or counts each pair where those are not complete yet; any
other store counts each pair.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ...backout.entry import REASONS
from ...backout.store import NO_BREAKER, Filter
from ...drain.status import DrainStatus
from ...drain.status import read as read_drain
from .store import DjangoBackoutStore

#: Seconds between beat's drain runs when the app's schedule does not say.
DEFAULT_PERIOD = 30.0
DRAIN_TASK = "celery_resilience.drain"


def by_breaker_and_reason(store: Any) -> dict[str, Counter[str]]:
    """Breaker -> reason -> parked entries, and ``"dead"`` -> dead entries of the breaker."""
    table: dict[str, Counter[str]] = {}
    if isinstance(store, DjangoBackoutStore):
        from django.db.models import Count

        from .models import ParkedTaskRecord

        rows = (
            ParkedTaskRecord.objects.using(store.using)
            .values_list("breaker", "reason", "status")
            .annotate(n=Count("pk"))
            .order_by()
        )
        for breaker, reason, status, n in rows:
            table.setdefault(breaker, Counter())[reason if status == "parked" else "dead"] += n
        return table
    counters = getattr(store, "reason_counters", lambda: None)()
    if counters is not None:  # "status|reason|breaker" -> n
        for field, n in counters.items():
            status, reason, breaker = field.split("|", 2)
            if n > 0:
                table.setdefault(breaker, Counter())[reason if status == "parked" else "dead"] += n
        return table
    for (breaker, status), n in store.tally().items():
        if status == "dead":
            table.setdefault(breaker, Counter())["dead"] += n
            continue
        for reason in REASONS:
            counted = store.count(Filter(breaker, "parked", reason))
            if counted:
                table.setdefault(breaker, Counter())[reason] += counted
    return table


def oldest(backout: Any) -> Any:
    """The oldest parked task (parked or dead), or ``None``."""
    store = backout.store
    if isinstance(store, DjangoBackoutStore):
        from .models import ParkedTaskRecord

        record = (
            ParkedTaskRecord.objects.using(store.using)
            .defer("payload")
            .order_by("parked_at", "id")
            .first()
        )
        return None if record is None else store.get(record.pk)
    total = backout.count()
    found = backout.list(limit=1, offset=total - 1) if total else []
    return found[0] if found else None


def beat_period(app: Any) -> float:
    """Seconds between runs of the drain task in the app's beat schedule (30 if not there)."""
    for entry in (app.conf.beat_schedule or {}).values():
        if entry.get("task") == DRAIN_TASK:
            schedule = entry.get("schedule")
            seconds = getattr(schedule, "total_seconds", None)
            if callable(seconds):
                return float(seconds())
            if isinstance(schedule, (int, float)):
                return float(schedule)
            run_every = getattr(schedule, "run_every", None)
            if run_every is not None:
                return float(run_every.total_seconds())
    return DEFAULT_PERIOD


def drain(res: Any) -> DrainStatus:
    return read_drain(res.runtime)


def rows(table: dict[str, Counter[str]]) -> list[dict[str, Any]]:
    """The table's lines, the breakers with the most entries first."""
    lines = []
    for breaker, counts in table.items():
        lines.append(
            {
                "breaker": breaker,
                "label": "(none)" if breaker == NO_BREAKER else breaker,
                "cells": [counts.get(reason, 0) for reason in REASONS],
                "dead": counts.get("dead", 0),
                "total": sum(counts.values()),
            }
        )
    return sorted(lines, key=lambda line: (-line["total"], line["breaker"]))
