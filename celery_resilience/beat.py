"""Celery tasks registered by the package (in every app, as ``shared_task`` does)."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from .resilience import Resilience


@shared_task(name="celery_resilience.drain", bind=True, ignore_result=False)  # type: ignore[untyped-decorator]
def drain(self: Any, breaker: str | None = None, limit: int | None = None) -> dict[str, Any]:
    """Replay due parked tasks of breakers that admit calls; run it from celery beat."""
    return Resilience.for_app(self.app).drain(breaker=breaker, limit=limit).as_dict()


def periodic_task(app: Any, every: float = 30.0, name: str = "celery-resilience-drain") -> Any:
    """Create or update the drain's row for django-celery-beat's ``DatabaseScheduler``.

    That scheduler copies ``app.conf.beat_schedule`` into its tables at start, but drops
    ``options["expires"]`` and stores intervals in whole seconds; this row keeps the expiry
    (``expire_seconds``). Needs Django set up with ``django_celery_beat`` installed; returns
    the ``PeriodicTask``.
    """
    if every < 1 or every != int(every):
        raise ValueError(f"django-celery-beat counts whole seconds: every={every!r}")
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    entry = Resilience.for_app(app).beat_schedule(every=every)
    interval, _ = IntervalSchedule.objects.get_or_create(
        every=int(every), period=IntervalSchedule.SECONDS
    )
    task, _ = PeriodicTask.objects.update_or_create(
        name=name,
        defaults={
            "task": entry["task"],
            "interval": interval,
            "expire_seconds": int(entry["options"]["expires"]),
            "enabled": True,
        },
    )
    return task
