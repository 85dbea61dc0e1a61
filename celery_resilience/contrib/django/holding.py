"""Which of a page's breakers hold their entries now (open or forced open: no drain sends them).

One snapshot a distinct breaker of the page, never one a row: a page of 100 entries of one
breaker costs one round trip.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...backout.entry import ParkedTask
from ...redact import get_logger

logger = get_logger("celery_resilience.admin")


def breaker_states(res: Any, entries: Iterable[ParkedTask]) -> dict[str, str]:
    """Breaker name -> state now, for the breakers of ``entries`` (unreadable ones left out)."""
    states: dict[str, str] = {}
    for name in sorted({entry.breaker for entry in entries if entry.breaker}):
        try:
            states[name] = str(res.breaker(name).snapshot()["state"])
        except Exception as exc:  # a derived breaker's bad name, Redis away: no "held" then
            logger.debug("No state for breaker %r: %s", name, exc)
    return states


def warnings(states: dict[str, str], counts: dict[str, int]) -> list[str]:
    """What a replay into an open breaker does, one sentence a breaker that admits no call."""
    said = []
    for name, state in sorted(states.items()):
        if state in ("open", "forced_open") and counts.get(name):
            n = counts[name]
            said.append(
                f"Breaker “{name}” is {state.replace('_', ' ')}: "
                f"{n} of these task{'' if n == 1 else 's'} will most likely be parked again at "
                "once, under a new entry id with its retries reset (its task id is kept: "
                "search for it)."
            )
    return said
