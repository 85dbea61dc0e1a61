"""Counting the commands one breaker's process sends to Redis.

The shared server also serves other clients (other tests' workers, a CI run beside this one), so
its own command counts say nothing of one process: count at the breaker's client instead.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from celery_resilience.breaker import Breaker, knowledge


class RoundTrips:
    """Counts the commands ``breaker``'s client sends from now on (scripts included)."""

    def __init__(self, breaker: Breaker) -> None:
        client = breaker._store().client  # type: ignore[attr-defined]
        self.count = 0
        send = client.execute_command

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return send(*args, **kwargs)

        client.execute_command = counted


def known(breaker: Breaker) -> Breaker:
    """Wait until the process knows the breaker for sure (its watch is live, its view learnt):
    from then on a closed breaker admits without a round trip and successes are held back."""
    deadline = time.monotonic() + 30.0
    while breaker._knowledge.admits(breaker.name) is None:
        assert time.monotonic() < deadline, "the breaker's view was never learnt"
        breaker.acquire().release()
        time.sleep(0.005)
    return breaker


def lasting_knowledge(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a reply taught the process stays good for 30 s, not ``MAX_KNOWLEDGE_AGE``: a test
    that counts no round trip over a sequence must not meet the re-ask a stall past that age
    brings (the change feed keeps the view right; only a reply renews its age)."""
    monkeypatch.setattr(knowledge, "MAX_KNOWLEDGE_AGE", 30.0)
