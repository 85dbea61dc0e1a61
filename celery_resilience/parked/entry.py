"""``ParkedTask``, one task that could not run now, and its byte encoding.

Encoding: an ASCII header line, then the body made by kombu's serializer registry::

    1;<content_type>;<content_encoding>\\n<body>

``1`` is the envelope version. The header lets :func:`decode` pick the decoder and apply the
``accept`` list (Celery's ``accept_content``) before touching the body, so pickle is never
loaded unless it is accepted. The body is a mapping of the dataclass fields; only those envelope
fields are validated, the task's ``args``/``kwargs`` may hold anything the serializer supports.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import traceback as tb
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from kombu import serialization
from kombu.utils import json as kombu_json

from ..errors import ConfigurationError, ResilienceError

Reason = Literal["breaker_open", "retries_exhausted", "park_on", "delay_too_long", "redelivered"]
Status = Literal["parked", "dead"]
REASONS: tuple[Reason, ...] = get_args(Reason)
STATUSES: tuple[Status, ...] = get_args(Status)

ENVELOPE_VERSION = "1"
#: Celery's default ``accept_content``: what :func:`decode` accepts when given no list.
DEFAULT_ACCEPT = ("json",)
TRACEBACK_LIMIT = 8192
#: ``task_name`` of the placeholder returned for an entry whose bytes can't be decoded.
UNDECODABLE_TASK = "<undecodable>"


class UndecodableEntry(ResilienceError):
    """Stored bytes are not a valid entry (garbage, a refused serializer, missing fields)."""


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


# kombu is untyped: give its entry points the types this module relies on.
_dumps: Callable[..., tuple[str, str, str | bytes]] = serialization.dumps
_loads: Callable[..., object] = serialization.loads
_prepare_accept: Callable[[Collection[str]], Collection[str]] = serialization.prepare_accept_content
_json_loads: Callable[[bytes], object] = kombu_json.loads
_JSON = "application/json"

FIELDS = tuple(f.name for f in dataclasses.fields(ParkedTask))


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
) -> ParkedTask:
    """The placeholder shown for stored bytes that can't be decoded (they stay in the store)."""
    return ParkedTask(
        id=entry_id,
        task_name=UNDECODABLE_TASK,
        task_id="",
        args=[],
        kwargs={},
        options={},
        breaker=breaker,
        reason=reason,
        exc_type=_qualname(type(error)),
        exc_message=f"entry {entry_id} can't be decoded: {error}",
        traceback="",
        retries=0,
        replays=0,
        parked_at=parked_at,
        due_at=due_at,
        status="dead",
        dead_reason="undecodable",
    )


def encode(entry: ParkedTask, serializer: str) -> bytes:
    """``entry`` as bytes (see the module docstring); kombu's ``EncodeError`` if args can't be."""
    body = {name: getattr(entry, name) for name in FIELDS}
    content_type, content_encoding, payload = _dumps(body, serializer=serializer)
    data = payload.encode(content_encoding) if isinstance(payload, str) else bytes(payload)
    return f"{ENVELOPE_VERSION};{content_type};{content_encoding}\n".encode("ascii") + data


def accepted_content_types(accept: Collection[str] | None) -> set[str]:
    """Serializer names or content types (like ``accept_content``) as content types."""
    return set(_prepare_accept(DEFAULT_ACCEPT if accept is None else accept))


def store_accept(serializer: str, accept: Collection[str] | None) -> frozenset[str]:
    """Content types a store decodes: ``accept``, else its own serializer and JSON.

    ``ConfigurationError`` when the serializer is unusable or ``accept`` would refuse what the
    store itself writes (every entry would come back undecodable).
    """
    try:
        _dumps({}, serializer=serializer)
        own = serialization.registry.name_to_type.get(serializer, serializer)
        allowed = accepted_content_types(
            [serializer, *DEFAULT_ACCEPT] if accept is None else accept
        )
    except Exception as exc:
        raise ConfigurationError(f"back-out serializer {serializer!r}: {exc}") from exc
    if own not in allowed:
        raise ConfigurationError(
            f"back-out serializer {serializer!r} is not in accept_content {sorted(accept or ())}"
        )
    return frozenset(allowed)


def decode(data: bytes, accept: Collection[str] | None = None) -> ParkedTask:
    """The entry stored in ``data``; ``UndecodableEntry`` for anything else.

    ``accept`` holds serializer names or content types (default: JSON only, as Celery); a
    ``frozenset`` is taken as content types already (what ``store_accept`` returns).
    """
    allowed = accept if isinstance(accept, frozenset) else accepted_content_types(accept)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise UndecodableEntry(f"expected bytes, got {type(data).__name__}")
    header, newline, body = bytes(data).partition(b"\n")
    try:
        version, content_type, content_encoding = header.decode("ascii").split(";")
    except (UnicodeDecodeError, ValueError):
        raise UndecodableEntry("no envelope header") from None
    if not newline or version != ENVELOPE_VERSION:
        raise UndecodableEntry(f"unknown envelope version {version!r}")
    if content_type not in allowed:
        raise UndecodableEntry(f"content type {content_type!r} is not accepted ({sorted(allowed)})")
    try:
        if content_type == _JSON and content_encoding == "utf-8":
            # kombu's JSON, minus its registry's lookups; the C decoder alone when no value of
            # kombu's own types (datetime, Decimal...: marked "__type__") needs its hook.
            fields = _json_loads(body) if b'"__type__"' in body else json.loads(body)
        else:
            fields = _loads(body, content_type, content_encoding, accept=allowed)
    except Exception as exc:  # any decoder (pickle above all) can raise anything on garbage
        raise UndecodableEntry(f"{content_type} body can't be decoded: {exc!r}") from exc
    return _from_fields(fields)


def _from_fields(fields: object) -> ParkedTask:
    if not isinstance(fields, dict):
        raise UndecodableEntry(f"body is a {type(fields).__name__}, not a mapping")
    # Unknown fields are ignored: a newer writer may add some.
    values = {name: fields[name] for name in FIELDS if name in fields}
    if len(values) < len(FIELDS) - 1:  # only dead_reason may be missing (older writers)
        missing = [name for name in FIELDS if name not in fields and name != "dead_reason"]
        if missing:
            raise UndecodableEntry(f"missing fields: {', '.join(missing)}")
    if isinstance(values["args"], tuple):  # serializers that keep tuples (pickle, yaml)
        values["args"] = list(values["args"])
    try:
        for name in ("parked_at", "due_at"):
            value = values[name]
            if type(value) is not float and _is_number(value):
                values[name] = float(value)
        return ParkedTask(**values)
    except (TypeError, ValueError, OverflowError) as exc:
        raise UndecodableEntry(str(exc)) from exc
