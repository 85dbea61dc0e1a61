"""What a breaker does while its Redis is down, and the outage logged once rather than per call.

``resilience_on_redis_error`` chooses the policy: ``fail_open`` admits calls unrecorded,
``fail_closed`` rejects them. Kept apart from the facade because it is one object shared by every
breaker of an app: the first breaker to lose Redis logs the outage, the first to reach it again
logs the recovery (once per outage, whatever its cause: a ``TroubleLog`` that does not tell
causes apart). The logger is the facade's, so log filters and captures see one source.
"""

from __future__ import annotations

from ..redact import get_logger
from ..trouble import TroubleLog

logger = get_logger("celery_resilience.breaker")


class RedisHealth:
    """Tracks an outage of the breakers' Redis so it is logged once, not once per call."""

    def __init__(self, policy: str) -> None:
        self.policy = policy
        self._outage = TroubleLog(logger, "the breakers' Redis", by_cause=False)

    def failed(self, breaker: str, exc: BaseException) -> None:
        if self._outage.first(exc):
            verdict = "admitting calls" if self.policy == "fail_open" else "rejecting calls"
            logger.error(
                "Redis unreachable for breaker %r (%s: %s): %s until it is back (%s)",
                breaker,
                type(exc).__name__,
                exc,
                verdict,
                self.policy,
            )

    def ok(self) -> None:
        if self._outage.recovered():
            logger.warning("Redis reachable again: breakers are shared once more")
