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
    dependency was not called, so a task it turns away waits in the broker with no retry spent
    (``turned_away.py``; in eager mode ``on_open`` decides: eager retries run at once,
    recursively, and must end)."""

    def __init__(self, breaker: str, state: str, retry_after: float | None = None) -> None:
        super().__init__(breaker, state, retry_after)
        self.args = (f"breaker {breaker!r} is {state} but its bulkhead is full",)


class RateLimited(ResilienceError):
    """A breaker's ``rate_limit`` admits no more calls now, fleet-wide; ``retry_after`` is how
    long (seconds, > 0) until this process may have its next slot.

    Not a ``BreakerOpen``: the dependency is not judged down, so code that parks or backs off
    on an open breaker does not take a rate limit for an outage; a task turned away by one
    waits in the broker with no retry spent (``delivery/fate.py``)."""

    def __init__(self, breaker: str, retry_after: float) -> None:
        self.breaker = breaker
        self.retry_after = retry_after
        super().__init__(f"breaker {breaker!r} is over its rate limit, retry in {retry_after:.3f}s")

    def __reduce__(self) -> tuple[type[RateLimited], tuple[str, float]]:
        return (type(self), (self.breaker, self.retry_after))


#: The errors by which a breaker refuses a call before the dependency is called (open, no probe
#: slot, bulkhead full, over the rate limit, Redis unreachable with ``fail_closed``): what
#: ``Breaker.call``'s ``fallback`` stands in for. A failure of the dependency itself is none.
REFUSALS: tuple[type[ResilienceError], ...] = (BreakerOpen, RateLimited)


class StoreUnavailable(ResilienceError):
    """Redis (or the configured store) could not be reached within its timeout."""


class NotReplicated(StoreUnavailable):
    """Fewer replicas than asked held a write in time; ``reply`` is the script's own reply."""

    def __init__(self, message: str, reply: Any) -> None:
        super().__init__(message)
        self.reply = reply


class AccessDenied(StoreUnavailable):
    """Redis refused a command to this process's user (``NOPERM``): no retry helps, its ACL
    rules must change (or the work must go to a process whose user may do it)."""


class StoreFull(ResilienceError):
    """The store holds ``max_entries`` entries: parking refuses loudly instead of dropping."""

    def __init__(self, max_entries: int, entry_id: str) -> None:
        self.max_entries = max_entries
        self.entry_id = entry_id
        super().__init__(f"back-out store is full ({max_entries} entries): {entry_id} not parked")

    def __reduce__(self) -> tuple[type[StoreFull], tuple[int, str]]:
        return (type(self), (self.max_entries, self.entry_id))


class UndecodableEntry(ResilienceError):
    """Stored bytes are not a valid entry (garbage, a refused serializer, missing fields)."""


class EntryNotFound(ResilienceError, KeyError):
    """No parked task has this id (replayed, deleted or purged meanwhile). A ``KeyError``, as
    callers of ``Backout.replay`` have caught it."""

    def __init__(self, entry_id: str) -> None:
        self.entry_id = entry_id
        super().__init__(entry_id)

    def __reduce__(self) -> tuple[type[EntryNotFound], tuple[str]]:
        return (type(self), (self.entry_id,))


class NotReplayable(ResilienceError, ValueError):
    """A replay on demand refused the entry; the message says why (its arguments no longer fit,
    it expired, it can't be decoded or trusted). A ``ValueError``, as callers have caught it."""


class DrainBusy(ResilienceError, TimeoutError):
    """A drain held the lock that a replay on demand waited for; try again in a moment. A
    ``TimeoutError``, as callers have caught it."""


class ParkedTaskDead(ResilienceError):
    """The result of a task whose back-out entry died (replays ran out, it expired, the broker
    refuses it...): its ``link_error`` callbacks get it, and a chord it belongs to fails."""


class Unparkable(ResilienceError):
    """A task the back-out store refused every time (``resilience_park_attempts`` parks): it
    ends in Celery FAILURE with this error, after an ERROR log line naming it."""


class TaskIdClaimed(ResilienceError):
    """Another delivery of this task id runs it now (``deduplicate=True``), or of another task id
    with its dedup ``key``: this one may not run before that one's claim ends, ``retry_after``
    seconds from now at most. A worker keeps such a delivery in the broker; an eager call raises
    this."""

    def __init__(self, task_id: str, retry_after: float, key: str = "") -> None:
        self.task_id = task_id
        self.retry_after = retry_after
        self.key = key
        held = (
            f"dedup key {key!r} of task id {task_id!r} is held"
            if key
            else f"task id {task_id!r} runs"
        )
        super().__init__(f"{held} in another delivery, {retry_after:.3f}s more")

    def __reduce__(self) -> tuple[type[TaskIdClaimed], tuple[str, float, str]]:
        return (type(self), (self.task_id, self.retry_after, self.key))
