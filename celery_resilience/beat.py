"""Celery tasks registered by the package (in every app, as ``shared_task`` does)."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from .resilience import Resilience


@shared_task(name="celery_resilience.drain", bind=True, ignore_result=False)  # type: ignore[untyped-decorator]
def drain(self: Any, breaker: str | None = None, limit: int | None = None) -> dict[str, Any]:
    """Replay due parked tasks of breakers that admit calls; run it from celery beat."""
    return Resilience.for_app(self.app).drain(breaker=breaker, limit=limit).as_dict()
