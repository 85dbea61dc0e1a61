"""How both admin pages show a parked task: plain strings, computed in Python, no JavaScript."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from typing import Any

from django.utils.text import Truncator

from ...backout.entry import ParkedTask
from ...backout.masking import SHOW_ALL, Masking
from ...backout.store import on_demand_only
from ...backout.summary import arguments
from ...backout.summary import summary as arguments_summary

#: Admin POST fields of an action, as Django's own changelist uses them.
ACTION_FIELD = "action"
SELECTED_FIELD = "_selected_action"
REPLAY = "replay_now"
DISCARD = "discard"
RECHECK = "recheck"
ACTIONS = ((REPLAY, "Replay now"), (DISCARD, "Discard"), (RECHECK, "Re-check dead entries"))
#: Characters of the arguments a list row shows (the whole, masked, is the cell's title).
ARGS_WIDTH = 40
#: Breaker states in which a drain replays nothing: their entries are held.
HOLDING = {"open": "held: breaker open", "forced_open": "held: forced open"}
#: Characters of an id a list shows.
SHORT = 8
#: Shown in place of what an encryption key this process does not have sealed.
ENCRYPTED = "encrypted (this process has no key that opens it)"
SEALED_LABELS = ("Args", "Kwargs", "Options", "Exception", "Traceback")


def when(seconds: float | None) -> str:
    """Epoch seconds as local date and time (``TIME_ZONE``), or a dash."""
    if seconds is None:
        return "—"
    from django.utils.timezone import localtime

    moment = localtime(datetime.fromtimestamp(seconds, tz=timezone.utc))
    return str(moment.strftime("%Y-%m-%d %H:%M:%S %Z"))


def short(text: str, keep: int = SHORT) -> str:
    """The start of a long id, so a list row stays one line (the whole id goes in a title)."""
    return text if len(text) <= keep + 1 else f"{text[:keep]}…"


def relative(seconds: float | None, now: float) -> str:
    """Epoch seconds as "3 minutes ago" or "in 5 minutes" seen from ``now``, or a dash."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    from django.utils.timesince import timesince, timeuntil

    delta = now - seconds
    if abs(delta) < 60:  # timesince would say "0 minutes"
        count = round(abs(delta))
        text = f"{count}\xa0second{'' if count == 1 else 's'}"
        return f"{text} ago" if delta >= 0 else f"in {text}"
    moment, reference = _utc(seconds), _utc(now)
    if delta > 0:
        return f"{timesince(moment, reference, depth=1)} ago"
    return f"in {timeuntil(moment, reference, depth=1)}"


def iso(seconds: float | None) -> str:
    """Epoch seconds as ISO 8601 in UTC (a ``<time datetime>``), or empty."""
    return "" if seconds is None or not math.isfinite(seconds) else _utc(seconds).isoformat()


def _utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=timezone.utc)


def due(status: str, reason: str, due_at: float, now: float, breaker_state: str = "") -> str:
    """When a drain may replay an entry: "now", "in 5 minutes", "on demand" (never by
    itself), "held: breaker open" while its breaker admits no call (the drain skips it), or a
    dash for a dead one (it waits for a person)."""
    if status == "dead":
        return "—"
    if on_demand_only(reason):
        return "on demand"
    if breaker_state in HOLDING:
        return HOLDING[breaker_state]
    return "now" if due_at <= now else relative(due_at, now)


def error(entry: ParkedTask, masking: Masking = SHOW_ALL) -> str:
    """The exception on one line: its class's own name and its message (sensitive values
    masked)."""
    if not entry.exc_type:
        return ""
    name = entry.exc_type.rpartition(".")[2]
    message = ENCRYPTED if entry.encrypted else " ".join(exc_message(entry, masking).split())
    return f"{name}: {message}" if message else name


def exc_message(entry: ParkedTask, masking: Masking) -> str:
    """The entry's error message with the values of its sensitive arguments masked."""
    return masking.text(entry.exc_message or "", entry.task_name, entry.args, entry.kwargs)


def pretty(value: Any) -> str:
    """JSON, indented; what JSON can't hold (pickled objects) as its ``repr``."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=repr)


def summary(
    entry: ParkedTask,
    now: float,
    masking: Masking = SHOW_ALL,
    breaker_states: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One row of a list: short ids, masked arguments and times relative to ``now``, each with
    its whole text for the cell's hover title, so a row stays one line on a laptop screen.
    ``breaker_states`` (breaker name -> state, read once a page) says which entries are held."""
    state = (breaker_states or {}).get(entry.breaker or "", "")
    return {
        "id": entry.id,
        "id_short": short(entry.id),
        "task_name": entry.task_name,
        "task_id": entry.task_id,
        "task_id_short": short(entry.task_id),
        "breaker": entry.breaker or "—",
        "reason": entry.reason,
        "status": entry.status,
        "dead_reason": entry.dead_reason or "",
        "parked_at": when(entry.parked_at),
        "parked_iso": iso(entry.parked_at),
        "parked_ago": relative(entry.parked_at, now),
        "due_at": when(entry.due_at),
        "due": due(entry.status, entry.reason, entry.due_at, now, state),
        "held": state in HOLDING and entry.status == "parked",
        "args": arguments_summary(entry, masking, ARGS_WIDTH),
        "args_whole": arguments(entry, masking),
        "error": error(entry, masking),
        "exc_type": entry.exc_type,
        "exc_message": ENCRYPTED
        if entry.encrypted
        else Truncator(exc_message(entry, masking)).chars(200),
    }


def details(
    entry: ParkedTask, *extra: tuple[str, str], masking: Masking = SHOW_ALL
) -> list[tuple[str, str, bool]]:
    """``(label, text, preformatted)`` rows of the detail page; ``extra`` rows go before args.
    Sensitive values are masked (``masking``), in the error and traceback too, and Celery's
    ``argsrepr``/``kwargsrepr`` stand in for the arguments they describe, as in Flower and
    Celery's logs."""
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
        ("Arguments", arguments(entry, masking)),
    ]
    if entry.encrypted:  # read without the encryption key: say so, show nothing sealed
        blocks = [(label, ENCRYPTED) for label in SEALED_LABELS]
        blocks[3] = ("Exception", f"{entry.exc_type}: {ENCRYPTED}" if entry.exc_type else "—")
        return [(label, text, False) for label, text in rows] + [
            (label, text, True) for label, text in blocks
        ]
    argsrepr, kwargsrepr = entry.options.get("argsrepr"), entry.options.get("kwargsrepr")
    blocks = [
        (
            "Args",
            argsrepr
            if isinstance(argsrepr, str)
            else pretty(masking.args(entry.task_name, entry.args)),
        ),
        (
            "Kwargs",
            kwargsrepr if isinstance(kwargsrepr, str) else pretty(masking.value(entry.kwargs)),
        ),
        ("Options", pretty(masking.value(entry.options))),
        (
            "Exception",
            f"{entry.exc_type}: {exc_message(entry, masking)}" if entry.exc_type else "—",
        ),
        (
            "Traceback",
            masking.text(entry.traceback, entry.task_name, entry.args, entry.kwargs)
            if entry.traceback
            else "—",
        ),
    ]
    return [(label, text, False) for label, text in rows] + [
        (label, text, True) for label, text in blocks
    ]
