"""What a message carries for the package: replay headers, entry ids, publish options.

A leaf: parking writes these, the drain and the worker read them, and neither imports the other.
"""

from __future__ import annotations

import hashlib
import pickle
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from kombu.utils import json as kombu_json

#: Message header carrying how often a parked task was replayed.
REPLAYS_HEADER = "resilience_replays"
#: Header counting replays the breaker rejected before the body ran (a half-open breaker
#: whose probe slot another call took): they must not use up ``resilience_max_replays``.
REJECTED_HEADER = "resilience_rejected"
#: Header counting the times in a row a full bulkhead turned a delivery away unrun
#: (``turned_away.py``): it describes one delivery's wait, never a parked entry's.
TURNED_AWAY_HEADER = "resilience_turned_away"
#: Set by the worker's main process on each delivery of a ``ResilientTask`` it hands to its pool,
#: never published: the token under which the delivery claims its task id (``deduplicate``) and
#: takes its bulkhead slot or probe, so that the main process can give them back when the pool
#: child dies (``time_limits.py``). It describes one delivery, as ``redelivered`` does.
DELIVERY_HEADER = "resilience_delivery"
#: Set by the worker's main process beside :data:`DELIVERY_HEADER`, never published: ``1`` when
#: it sends task events for the delivery (``-E``). The delivery's ``task-retried`` is then sent
#: where its retry is published, before the publish (``events.send_task_retried``), and not by
#: the main process: sent once the pool child's result came back, Celery's own could reach
#: Flower after the retry's ``task-parked`` or ``task-succeeded``, and Celery's event state lets
#: a late RETRY override any state.
TASK_EVENTS_HEADER = "resilience_task_events"
#: Kept in a parked entry's headers when tracing is on: the W3C ``traceparent`` of the span that
#: parked it, so that its replay's span links to it (signed and sealed with the entry's other
#: options; an entry without it replays unlinked).
PARKED_SPAN_HEADER = "resilience_parked_span"
#: kombu's mark of a message the broker delivered before (in its headers, on a Redis broker): it
#: describes one delivery, and a message published again from it is a first delivery.
REDELIVERED_HEADER = "redelivered"
#: Execution options that are entry fields of their own, or meaningless in a new message.
NOT_OPTIONS = frozenset(
    {"task_id", "retries", "reply_to", "origin", "delivery_tag", "redelivered", "is_eager"}
)
_ENTRY_NAMESPACE = uuid.UUID("5b1c6c1e-6a0f-4d55-9d0b-2f1f0c1e7a11")
#: Execution options that are part of what a message asks for, beside its arguments: what runs
#: after it. Routing (queue, priority) is not: the same work sent elsewhere is the same work.
BODY_OPTIONS = ("link", "link_error", "chain", "chord", "group_id")
_json_dumps: Callable[..., str] = kombu_json.dumps  # kombu's types too (datetime, UUID...)


def _count(value: Any) -> int:
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return 0


def message_headers(request: Any) -> Mapping[str, Any]:
    """A task request's ``headers`` if they are a mapping, else none: Celery's request stack
    takes anything there (``task.apply(args, headers=123)``) and reads nothing from it."""
    headers = getattr(request, "headers", None)
    return headers if isinstance(headers, Mapping) else {}


def request_header(request: Any, name: str) -> Any:
    """Header ``name`` of a task request, ``None`` if absent: the package's one reader of them.

    A worker lifts a message's own headers onto the request as attributes; ``apply()`` and a
    nested call keep them in ``request.headers``, whatever that holds (see
    :func:`message_headers`)."""
    value = getattr(request, name, None)
    return message_headers(request).get(name) if value is None else value


def request_count(request: Any, name: str) -> int:
    """A count header of a task request (0 when absent or not a count)."""
    return _count(request_header(request, name))


def replays_of(request: Any) -> int:
    """How often this task was published again from the back-out store."""
    return request_count(request, REPLAYS_HEADER)


def rejected_replays(headers: Mapping[str, Any] | None) -> int:
    """Replays that the breaker turned away unrun (they do not count against max_replays)."""
    return _count((headers or {}).get(REJECTED_HEADER, 0))


def redelivered(request: Any) -> bool:
    """Whether the broker delivered this message before: kombu's Redis transport flags a
    restored or requeued message (``delivery_info`` and headers), RabbitMQ does natively. A
    first delivery can't be a poison loop, so only these are counted."""
    if (getattr(request, "delivery_info", None) or {}).get("redelivered"):
        return True
    return bool(message_headers(request).get(REDELIVERED_HEADER))


def delivery_token(request: Any) -> str:
    """The token the worker's main process gave this delivery (``""``: none, an eager call)."""
    if getattr(request, "is_eager", False):
        return ""
    return str(request_header(request, DELIVERY_HEADER) or "")


def new_message_headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """The headers of a message published again from a delivery's (a retry, a kept copy)."""
    of_delivery = (REDELIVERED_HEADER, DELIVERY_HEADER, TASK_EVENTS_HEADER)
    return {k: v for k, v in (headers or {}).items() if k not in of_delivery}


def body_digest(
    args: Any, kwargs: Mapping[str, Any] | None, options: Mapping[str, Any] | None = None
) -> str:
    """A digest of what a message asks for: its arguments and what runs after it.

    The same message delivered again gives the same digest; another message that reuses the
    task id with other arguments gives another. JSON with sorted keys where the arguments allow
    it (kwargs in any order are one body), else pickle (the same message decodes to equal bytes).
    """
    body: list[Any] = [list(args or ()), dict(kwargs or {})]
    body += [(options or {}).get(name) for name in BODY_OPTIONS]
    try:
        data = _json_dumps(body, sort_keys=True, separators=(",", ":")).encode()
    except (TypeError, ValueError):
        data = pickle.dumps(body, protocol=4)
    return hashlib.sha256(data).hexdigest()[:32]


def entry_id(task_id: str, replays: int, retries: int, digest: str) -> str:
    """The back-out entry id of one delivery: a redelivered message parks onto the same entry,
    and another body under the same task id (``digest``: :func:`body_digest`) onto its own."""
    return uuid.uuid5(_ENTRY_NAMESPACE, f"{task_id}/{replays}/{retries}/{digest}").hex


def publish_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Execution options worth keeping to publish a message again (queue, priority, links...)."""
    headers = new_message_headers(options.get("headers"))
    headers.pop(REPLAYS_HEADER, None)
    kept = {**options, "headers": headers}
    return {k: v for k, v in kept.items() if k not in NOT_OPTIONS and v not in (None, {}, [])}


def replay_headers(options: Mapping[str, Any], replays: int) -> dict[str, Any]:
    """The headers of a replay: the entry's own, with the replay counted."""
    headers = dict(options.get("headers") or {})
    headers[REPLAYS_HEADER] = replays + 1
    return headers


def parked_span(headers: Mapping[str, Any] | None) -> str | None:
    """The ``traceparent`` of the span that parked an entry (:data:`PARKED_SPAN_HEADER`), if
    its headers keep one."""
    return _span((headers or {}).get(PARKED_SPAN_HEADER))


def parked_span_of(request: Any) -> str | None:
    """The ``traceparent`` of the span that parked this delivery's entry (a replay), if any."""
    return _span(request_header(request, PARKED_SPAN_HEADER))


def _span(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
