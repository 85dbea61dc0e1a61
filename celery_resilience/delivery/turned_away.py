"""A delivery that a full bulkhead turned away waits in the broker, backing off per turn-away.

A full bulkhead is a busy dependency, not a down one: the delivery is sent again with its
retries unchanged (no attempt spent). Sent again after the backoff of its *current* attempt every
time, each delivery that met a full bulkhead would be back within about a second, again and
again: while a dependency hangs and its breaker has not opened yet (its first timeouts), those
copies become a storm of sends that takes the very pool slots the bulkhead keeps free for other
tasks. So each turn-away is counted in a header, and the next wait is the task's own backoff for
that count (no further than its ``max_retries``: the range the strategy was written for), never
longer than the breaker's open timeout (a dependency full for that long is as good as down: its
breaker decides by then) nor than the broker holds a message safely. The count starts again once
the body runs, and a parked entry does not keep it (a replay meets the bulkhead afresh).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..headers import TURNED_AWAY_HEADER
from ..redact import get_logger

logger = get_logger("celery_resilience.task")


def next_wait(times: int, attempts: int, backoff: Callable[[int], float], cap: float) -> float:
    """Seconds a delivery turned away ``times`` times in a row so far waits before it comes back:
    ``backoff`` for that count (no further than ``attempts``, the task's retry range), at most
    ``cap`` (its breaker's longest open time, within what the broker holds safely)."""
    attempt = min(times, attempts)
    try:
        wait = float(backoff(attempt))
    except Exception:  # a strategy that fails here must not turn a wait into a lost task
        logger.exception("The backoff %r failed for attempt %d", backoff, attempt)
        wait = cap
    return min(wait, cap) if math.isfinite(wait) else cap


def forget(headers: dict[str, Any]) -> dict[str, Any]:
    """``headers`` without the count: for a delivery whose body ran, and for a parked entry."""
    return {k: v for k, v in headers.items() if k != TURNED_AWAY_HEADER}
