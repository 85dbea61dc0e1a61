"""The typed error hierarchy: catch ``ResilienceError`` to catch everything of ours."""

from __future__ import annotations

from typing import Any

from .redact import redact


class ResilienceError(Exception):
    """Base class of every error raised by celery-resilience; its message never shows a password
    (a URL's credentials are masked)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class ConfigurationError(ResilienceError, ValueError):
    """A ``resilience_*`` setting or a task option is invalid; the message names it."""


class BreakerOpen(ResilienceError):
    """A breaker did not admit the call.

    ``retry_after`` is how long (seconds) until the breaker may admit a probe, or ``None`` when
    unknown (forced open, Redis unreachable with ``fail_closed``).
    """

    def __init__(self, breaker: str, state: str, retry_after: float | None = None) -> None:
        self.breaker = breaker
        self.state = state
        self.retry_after = retry_after
        hint = f", retry in {retry_after:.3f}s" if retry_after is not None else ""
        super().__init__(f"breaker {breaker!r} is {state}{hint}")

    def __reduce__(self) -> tuple[type[BreakerOpen], tuple[str, str, float | None]]:
        # Result backends pickle or rebuild exceptions from their arguments.
        return (type(self), (self.breaker, self.state, self.retry_after))


class BulkheadFull(BreakerOpen):
    """The breaker would admit the call, but ``max_concurrent_calls`` calls to its dependency are
    already in flight across the fleet. A ``BreakerOpen``, so code that handles a rejection
    handles this one too; ``retry_after`` is ``None``: a slot frees when some call ends. The
    dependency was not called, so a task retried for it (``on_open="retry"``) spends no retry
    (in eager mode it does: eager retries run at once, recursively, and must end)."""

    def __init__(self, breaker: str, state: str, retry_after: float | None = None) -> None:
        super().__init__(breaker, state, retry_after)
        self.args = (f"breaker {breaker!r} is {state} but its bulkhead is full",)


class StoreUnavailable(ResilienceError):
    """Redis (or the configured store) could not be reached within its timeout."""


class ParkedTaskDead(ResilienceError):
    """The result of a task whose back-out entry died (replays ran out, it expired, the broker
    refuses it...): its ``link_error`` callbacks get it, and a chord it belongs to fails."""


class Unparkable(ResilienceError):
    """A task the back-out store refused every time (``resilience_park_attempts`` parks): it
    ends in Celery FAILURE with this error, after an ERROR log line naming it."""


class TaskIdClaimed(ResilienceError):
    """Another delivery of this task id runs it now (``deduplicate=True``): this one may not run
    before that one's claim ends, ``retry_after`` seconds from now at most. A worker keeps such a
    delivery in the broker; an eager call raises this."""

    def __init__(self, task_id: str, retry_after: float) -> None:
        self.task_id = task_id
        self.retry_after = retry_after
        super().__init__(f"task id {task_id!r} runs in another delivery, {retry_after:.3f}s more")

    def __reduce__(self) -> tuple[type[TaskIdClaimed], tuple[str, float]]:
        return (type(self), (self.task_id, self.retry_after))
