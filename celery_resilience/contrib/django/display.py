"""How both admin pages show a parked task: plain strings, computed in Python, no JavaScript."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from ...parked.entry import ParkedTask

#: Admin POST fields of an action, as Django's own changelist uses them.
ACTION_FIELD = "action"
SELECTED_FIELD = "_selected_action"
REPLAY = "replay_now"
DISCARD = "discard"
ACTIONS = ((REPLAY, "Replay now"), (DISCARD, "Discard"))


def when(seconds: float | None) -> str:
    """Epoch seconds as local date and time (``TIME_ZONE``), or a dash."""
    if seconds is None:
        return "—"
    from django.utils.timezone import localtime

    moment = localtime(datetime.fromtimestamp(seconds, tz=timezone.utc))
    return str(moment.strftime("%Y-%m-%d %H:%M:%S %Z"))


def pretty(value: Any) -> str:
    """JSON, indented; what JSON can't hold (pickled objects) as its ``repr``."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=repr)


def summary(entry: ParkedTask) -> dict[str, Any]:
    """One row of a list."""
    return {
        "id": entry.id,
        "task_name": entry.task_name,
        "task_id": entry.task_id,
        "breaker": entry.breaker or "—",
        "reason": entry.reason,
        "status": entry.status,
        "dead_reason": entry.dead_reason or "",
        "parked_at": when(entry.parked_at),
        "due_at": when(entry.due_at),
        "exc_type": entry.exc_type,
    }


def details(entry: ParkedTask, *extra: tuple[str, str]) -> list[tuple[str, str, bool]]:
    """``(label, text, preformatted)`` rows of the detail page; ``extra`` rows go before args."""
    rows = [
        ("Entry id", entry.id),
        ("Task", entry.task_name),
        ("Task id", entry.task_id),
        ("Breaker", entry.breaker or "—"),
        ("Reason", entry.reason),
        ("Status", entry.status),
        ("Dead reason", entry.dead_reason or "—"),
        ("Parked at", when(entry.parked_at)),
        ("Due at", when(entry.due_at)),
        ("Retries", str(entry.retries)),
        ("Replays", str(entry.replays)),
        *extra,
    ]
    blocks = [
        ("Args", pretty(entry.args)),
        ("Kwargs", pretty(entry.kwargs)),
        ("Options", pretty(entry.options)),
        ("Exception", f"{entry.exc_type}: {entry.exc_message}" if entry.exc_type else "—"),
        ("Traceback", entry.traceback or "—"),
    ]
    return [(label, text, False) for label, text in rows] + [
        (label, text, True) for label, text in blocks
    ]
