"""Celery tasks registered by the package (in every app, as ``shared_task`` does)."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from . import maintenance
from .backout.redis import BackoutKeys
from .drain import status as drain_status
from .redact import get_logger
from .resilience import Resilience
from .runtime import Runtime

logger = get_logger("celery_resilience.drain")

#: A follow-up pass not started this long after it was due is dropped (beat's tick goes on).
FOLLOW_UP_EXPIRES = 30.0


@shared_task(name="celery_resilience.drain", bind=True, ignore_result=False)
def drain(self: Any, breaker: str | None = None, limit: int | None = None) -> dict[str, Any]:
    """Replay what may go out now of breakers that admit calls, and return: run it from beat.

    It never waits (the pool slot is back at once). When entries are left that the pace, a full
    queue or the breaker held back, it sends itself again in ``report.next_in`` seconds, so a
    recovery starts when the breaker closes and goes as fast as the queue empties, not only at
    beat's period.
    """
    resilience = Resilience.for_app(self.app)
    try:  # what the operator's views read: beat is alive, maintenance windows end on time
        drain_status.mark_ran(resilience.runtime)
        maintenance.end_expired(resilience.runtime)
    except Exception as exc:  # Redis away: the drain below says so; the next pass tries again
        logger.warning("Drain task bookkeeping failed: %s", exc)
    report = resilience.drain_once(breaker=breaker, limit=limit)
    if report.next_in is not None:
        follow_up(self, resilience.runtime, report.next_in, {"breaker": breaker, "limit": limit})
    return report.as_dict()


def follow_up(task: Any, runtime: Runtime, delay: float, kwargs: dict[str, Any]) -> None:
    """Send the next pass in ``delay`` seconds, unless one is already on its way.

    A key that lives until the pass is due lets one pass be pending at a time, whichever run
    (beat's or a follow-up) asked: chains started by beat's ticks merge instead of multiplying.
    """
    config = runtime.config
    if config.in_memory or task.app.conf.task_always_eager:
        return  # one process (eager would run it at once, recursively): beat's tick paces
    key = f"{BackoutKeys.for_prefix(config.key_prefix).tag}:drain-next"
    try:
        if runtime.redis.set(key, "1", nx=True, px=max(1, int(delay * 1000))):
            task.apply_async(kwargs=kwargs, countdown=delay, expires=delay + FOLLOW_UP_EXPIRES)
    except Exception as exc:  # the next beat tick drains anyway
        logger.warning("Could not send the drain's next pass: %s", exc)


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
