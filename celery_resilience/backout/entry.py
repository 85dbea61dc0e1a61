"""``ParkedTask``, one task that could not run now (its byte encoding is in ``codec.py``).

Only the envelope fields are validated; the task's ``args``/``kwargs`` may hold anything the
store's serializer supports.
"""

from __future__ import annotations

import dataclasses
import math
import time
import traceback as tb
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

Reason = Literal[
    "breaker_open", "retries_exhausted", "park_on", "delay_too_long", "redelivered", "retry_budget"
]
Status = Literal["parked", "dead"]
REASONS: tuple[Reason, ...] = get_args(Reason)
STATUSES: tuple[Status, ...] = get_args(Status)

TRACEBACK_LIMIT = 8192
#: ``task_name`` of the placeholder returned for an entry whose bytes can't be decoded.
UNDECODABLE_TASK = "<undecodable>"
#: ``task_name`` of the placeholder of an entry that failed the store's signature check.
UNVERIFIED_TASK = "<unverified>"


def _qualname(cls: type) -> str:
    name = cls.__qualname__
    return name if cls.__module__ == "builtins" else f"{cls.__module__}.{name}"


def _is_number(value: object) -> bool:
    # bool is an int subclass, but ``retries=True`` is corruption, not 1.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class ParkedTask:
    """Everything needed to publish a parked task again, and to tell a person why it was parked."""

    id: str
    task_name: str
    task_id: str
    args: list[Any]
    kwargs: dict[str, Any]
    options: dict[str, Any]
    breaker: str | None
    reason: Reason
    exc_type: str
    exc_message: str
    traceback: str
    retries: int
    replays: int
    parked_at: float
    due_at: float
    status: Status
    dead_reason: str | None = field(default=None)
    #: When its signed lifetime ends (epoch seconds): past it a drain can no longer tell the
    #: entry from a copy of one it consumed (``None``: written by a release that signed none).
    #: Set by the store that keeps the entry, so two copies of one task compare equal without.
    expires_at: float | None = field(default=None, compare=False)
    #: Read without the encryption key: ``args``, ``kwargs``, ``options``, ``exc_message`` and
    #: ``traceback`` are sealed (empty here); such an entry can be listed, never published.
    encrypted: bool = field(default=False)
    #: Why this process can't use the entry although another may (a key it lacks, a format of a
    #: newer release): it leaves it parked for one that can. Never stored.
    held: str | None = field(default=None)
    #: The reason ``held`` gives, as a code (``unknown_key``, ``newer_format``): what held
    #: entries are counted by.
    held_code: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        # The one place the envelope is validated: decode relies on it for stored bytes too.
        for name in ("id", "task_name", "task_id", "exc_type", "exc_message", "traceback"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"ParkedTask.{name} must be a str")
        if not self.id:
            raise ValueError("ParkedTask.id must not be empty")
        if not isinstance(self.args, list):
            raise TypeError("ParkedTask.args must be a list")
        if not isinstance(self.kwargs, dict) or not all(isinstance(k, str) for k in self.kwargs):
            raise TypeError("ParkedTask.kwargs must be a dict with str keys")
        if not isinstance(self.options, dict):
            raise TypeError("ParkedTask.options must be a dict")
        if self.breaker is not None and not isinstance(self.breaker, str):
            raise TypeError("ParkedTask.breaker must be a str or None")
        if self.dead_reason is not None and not isinstance(self.dead_reason, str):
            raise TypeError("ParkedTask.dead_reason must be a str or None")
        if not isinstance(self.encrypted, bool):
            raise TypeError("ParkedTask.encrypted must be a bool")
        if self.held is not None and not isinstance(self.held, str):
            raise TypeError("ParkedTask.held must be a str or None")
        if (self.held is None) != (self.held_code is None):
            raise ValueError("ParkedTask.held and held_code go together")
        if self.expires_at is not None and (
            not _is_number(self.expires_at) or not math.isfinite(self.expires_at)
        ):
            raise ValueError("ParkedTask.expires_at must be a finite number of epoch seconds")
        if self.reason not in REASONS:
            raise ValueError(f"ParkedTask.reason must be one of {REASONS}, got {self.reason!r}")
        if self.status not in STATUSES:
            raise ValueError(f"ParkedTask.status must be one of {STATUSES}, got {self.status!r}")
        for name in ("retries", "replays"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"ParkedTask.{name} must be an integer >= 0")
        for name in ("parked_at", "due_at"):
            value = getattr(self, name)
            if not _is_number(value) or not math.isfinite(value):
                raise ValueError(f"ParkedTask.{name} must be a finite number of epoch seconds")

    @classmethod
    def new(
        cls,
        *,
        task_name: str,
        task_id: str,
        reason: Reason,
        args: Iterable[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        breaker: str | None = None,
        exc: BaseException | None = None,
        exc_type: str = "",
        exc_message: str = "",
        traceback: str = "",
        retries: int = 0,
        replays: int = 0,
        parked_at: float | None = None,
        due_at: float | None = None,
        status: Status = "parked",
        dead_reason: str | None = None,
    ) -> ParkedTask:
        """A fresh entry with a new uuid4 id; ``exc`` fills the three ``exc_*`` fields at once."""
        if exc is not None:
            exc_type = exc_type or _qualname(type(exc))
            exc_message = exc_message or str(exc)
            traceback = traceback or "".join(tb.format_exception(type(exc), exc, exc.__traceback__))
        parked = time.time() if parked_at is None else float(parked_at)
        return cls(
            id=uuid.uuid4().hex,
            task_name=task_name,
            task_id=task_id,
            args=list(args),
            kwargs=dict(kwargs or {}),
            options=dict(options or {}),
            breaker=breaker,
            reason=reason,
            exc_type=exc_type,
            exc_message=exc_message,
            traceback=cut_traceback(traceback),
            retries=retries,
            replays=replays,
            parked_at=parked,
            due_at=parked if due_at is None else float(due_at),
            status=status,
            dead_reason=dead_reason,
        )

    def replace(self, **changes: Any) -> ParkedTask:
        """A copy with ``changes`` applied (validated like any new entry)."""
        return dataclasses.replace(self, **changes)


def cut_traceback(text: str, limit: int = TRACEBACK_LIMIT) -> str:
    """``text`` cut to at most ``limit`` characters, keeping the tail (the innermost frames)."""
    if len(text) <= limit:
        return text
    widest = f"[... {len(text)} characters cut ...]\n"
    if limit <= len(widest):
        return text[len(text) - limit :]
    tail = text[len(text) - (limit - len(widest)) :]
    newline = tail.find("\n")
    if 0 <= newline < 200:  # start on a whole line when one begins close by
        tail = tail[newline + 1 :]
    return f"[... {len(text) - len(tail)} characters cut ...]\n{tail}"


def undecodable(
    entry_id: str,
    error: BaseException,
    *,
    breaker: str | None = None,
    reason: Reason = "park_on",
    parked_at: float = 0.0,
    due_at: float = 0.0,
    code: str = "undecodable",
    status: Status = "dead",
) -> ParkedTask:
    """The placeholder shown for stored bytes that can't be decoded or can't be trusted
    (``code``: the dead reason they get, or got; ``status``: the store's, ``parked`` until a
    drain marks them dead; the bytes stay in the store)."""
    return ParkedTask(
        id=entry_id,
        task_name=UNDECODABLE_TASK if code == "undecodable" else UNVERIFIED_TASK,
        task_id="",
        args=[],
        kwargs={},
        options={},
        breaker=breaker,
        reason=reason,
        exc_type=_qualname(type(error)),
        exc_message=f"entry {entry_id} can't be {_VERB.get(code, 'decoded')}: {error}",
        traceback="",
        retries=0,
        replays=0,
        parked_at=parked_at,
        due_at=due_at,
        status=status,
        dead_reason=code,
    )


_VERB = {"tampered": "trusted", "unsigned": "trusted", "undecryptable": "decrypted"}


def held_placeholder(
    entry_id: str,
    why: str,
    code: str,
    *,
    breaker: str | None,
    reason: Reason,
    parked_at: float,
    status: Status,
    dead_reason: str | None,
) -> ParkedTask:
    """The placeholder of an entry this process can't read but another may (``why``, and as a
    ``code``): it keeps the status the store gives it, and says why in ``held``."""
    return ParkedTask(
        id=entry_id,
        task_name=HELD_TASK,
        task_id="",
        args=[],
        kwargs={},
        options={},
        breaker=breaker,
        reason=reason,
        exc_type="",
        exc_message=f"entry {entry_id} is held here: {why}",
        traceback="",
        retries=0,
        replays=0,
        parked_at=parked_at,
        due_at=parked_at,
        status=status,
        dead_reason=dead_reason,
        held=why,
        held_code=code,
    )


#: ``task_name`` of the placeholder of an entry held for a process that can read it.
HELD_TASK = "<held>"
#: What a process knows of an entry beside its body: never stored in it.
NOT_STORED = ("encrypted", "held", "held_code")
#: The fields an entry's body holds.
FIELDS = tuple(f.name for f in dataclasses.fields(ParkedTask) if f.name not in NOT_STORED)
#: Fields an older writer may have left out of a body.
OPTIONAL = ("dead_reason", "expires_at")
