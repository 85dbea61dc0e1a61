"""The time limits Celery applies to a delivery, as the worker does: the message's, else the
task's (its option, else ``task_time_limit``), else the worker's own. The worker's live on its
``WorkController`` (``celery worker --time-limit / --soft-time-limit``), not in ``app.conf``,
and only a pool that can stop a task applies any: prefork kills the child, the green pools
raise in the task; solo and threads run every task to its end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WorkerLimits:
    """What a worker applies to a task without limits of its own (seconds, ``None``: none), and
    whether its pool applies limits at all. Outside a worker: nothing of its own, and the
    task's limits taken as declared."""

    hard: float | None = None
    soft: float | None = None
    applied: bool = True
    #: Read from a worker: ``False`` in a process that is none (the command line's ``check``),
    #: which can't see the flags its workers run with.
    in_worker: bool = False

    @classmethod
    def of(cls, worker: Any) -> WorkerLimits:
        """A ``WorkController``'s (at ``worker_init``, before its pool starts)."""
        return cls(
            _seconds(getattr(worker, "time_limit", None)),
            _seconds(getattr(worker, "soft_time_limit", None)),
            _pool_applies_limits(getattr(worker, "pool_cls", None)),
            True,
        )


def hard_limit(task: Any, request: Any, worker: WorkerLimits) -> float | None:
    """The hard time limit the worker applies to this delivery (``request``; ``None``: the
    task's in general), in seconds, or ``None`` if none applies."""
    if not worker.applied:
        return None
    message = (getattr(request, "timelimit", None) or (None, None))[0]
    return _seconds(message or _own(task, "time_limit") or worker.hard)


def soft_limit(task: Any, worker: WorkerLimits) -> float | None:
    """The soft time limit the worker applies to the task's deliveries, if any."""
    if not worker.applied:
        return None
    return _seconds(_own(task, "soft_time_limit") or worker.soft)


def _own(task: Any, name: str) -> Any:
    """A task's own limit, else the app's ``task_<name>``."""
    return getattr(task, name, None) or task.app.conf.get(f"task_{name}")


def _seconds(value: Any) -> float | None:
    try:
        seconds = float(value) if value else None
    except (TypeError, ValueError):
        return None
    return seconds if seconds and seconds > 0 else None


def _pool_applies_limits(pool_cls: Any) -> bool:
    """Whether a worker's pool (its ``-P`` name or class) stops a task at its time limit."""
    if pool_cls is None:
        return True
    try:
        from celery.concurrency import get_implementation
        from celery.concurrency.prefork import TaskPool as Prefork

        cls = get_implementation(pool_cls) if isinstance(pool_cls, str) else pool_cls
        return bool(getattr(cls, "is_green", False)) or issubclass(cls, Prefork)
    except Exception:  # a pool this cannot load or judge: its task limits taken as declared
        return True
