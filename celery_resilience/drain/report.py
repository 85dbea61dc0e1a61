"""What one drain run did: its report, and what it adds to the store's monotonic counters."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..backout.store import FamilyOf, counter_scope

if TYPE_CHECKING:
    from .batch import BatchOutcome


@dataclass
class DrainReport:
    """What one drain run did; ``skipped`` are due entries held back (breaker, rate, limit),
    but for those of a breaker named at call time that a pass skipped without a look (open,
    its open time not over: ``gate.still_held``)."""

    replayed: int = 0
    skipped: int = 0
    dead: int = 0
    #: Entries left parked for a process that can read them (a key this one lacks, a newer
    #: release's format): due again later, never dead.
    held: int = 0
    errors: int = 0
    locked: bool = False  # another drain held the lock: this one did nothing
    #: Why Redis refused this process's user the drain (``NOPERM``): it published nothing
    #: more; ``None`` when it did not.
    denied: str | None = None
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


def figures(report: DrainReport) -> dict[str, int]:
    """The report's counts, as a drain's span shows them."""
    return {
        "replayed": report.replayed,
        "skipped": report.skipped,
        "dead": report.dead,
        "held": report.held,
        "errors": report.errors,
        "locked": int(report.locked),
    }


def tally(report: DrainReport, name: str, outcome: BatchOutcome) -> None:
    """Count a batch of breaker ``name`` in the run's report."""
    stats = report.breakers[name]
    stats["replayed"] += outcome.published
    stats["dead"] += outcome.dead
    report.replayed += outcome.published
    report.dead += outcome.dead
    report.held += outcome.held
    for key, n in outcome.dead_reasons.items():
        report.dead_reasons[key] = report.dead_reasons.get(key, 0) + n
    if outcome.down:
        report.errors += 1


def left_due(report: DrainReport, name: str, left: int) -> None:
    """Count the ``left`` entries of breaker ``name`` still due after the run replayed its."""
    report.breakers[name]["skipped"] = left
    report.skipped += left


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
