"""What one drain run did: its report, and what it adds to the store's monotonic counters."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..backout.store import FamilyOf, counter_scope


@dataclass
class DrainReport:
    """What one drain run did; ``skipped`` are due entries held back (breaker, rate, limit),
    but for those of a breaker named at call time that a pass skipped without a look (open,
    its open time not over: ``gate.still_held``)."""

    replayed: int = 0
    skipped: int = 0
    dead: int = 0
    errors: int = 0
    locked: bool = False  # another drain held the lock: this one did nothing
    duration: float = 0.0
    #: Seconds after which another pass has work (entries left that the pace, the queue or
    #: the breaker held back); ``None``: nothing to do before the next beat tick.
    next_in: float | None = None
    breakers: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Entries that died in this run, by ``<breaker>|<dead reason code>`` (metrics).
    dead_reasons: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The report as plain data (the ``celery_resilience.drain`` task's result)."""
        return asdict(self)


def counters(report: DrainReport, family_of: FamilyOf) -> dict[str, float]:
    """What a run adds to the store's monotonic counters (metrics); breakers named at call time
    count under their base (``counter_scope``)."""
    counters: dict[str, float] = {"drain_runs": 1, "drain_seconds": report.duration}

    def add(key: str, n: float) -> None:
        counters[key] = counters.get(key, 0) + n

    for name, stats in report.breakers.items():
        for what in ("replayed", "dead"):
            if stats[what]:
                add(f"{what}|{counter_scope(name, family_of)}", stats[what])
    for key, n in report.dead_reasons.items():
        name, _, code = key.rpartition("|")
        add(f"dead_reason|{counter_scope(name, family_of)}|{code}", n)
    return counters
