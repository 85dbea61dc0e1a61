"""Who did what from the admin, and why: Django's ``LogEntry`` ("Recent actions", each object's
history) and the ``celery_resilience.admin`` log, for every replay, discard and breaker lever.

Entries are logged one ``LogEntry`` each (written in one ``bulk_create`` a chunk), so an entry's
fate can be looked up by its id; the log gets one line an action with the user, the count,
the reason and the first ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...backout.entry import ParkedTask
from ...redact import get_logger

logger = get_logger("celery_resilience.admin")
#: Ids named in the log line of one action; the rest are counted.
LOGGED_IDS = 20
#: Longest reason kept (one line).
REASON_MAX = 500
_CHUNK = 500


def clean_reason(text: str | None) -> str:
    """The operator's reason on one line, cut to ``REASON_MAX`` characters."""
    line = " ".join((text or "").split())
    return line[:REASON_MAX]


def _message(what: str, reason: str) -> str:
    return f"{what} from the admin. Reason: {reason}" if reason else f"{what} from the admin."


def entries(
    request: Any, model: Any, done: Sequence[ParkedTask], what: str, reason: str, flag: int
) -> None:
    """Record that ``done`` were ``what`` ("Replayed", "Discarded") by the request's user."""
    if not done:
        return
    from django.contrib.admin.models import LogEntry
    from django.contrib.contenttypes.models import ContentType

    kind = ContentType.objects.get_for_model(model, for_concrete_model=False)
    message = _message(what, reason)
    rows = [
        LogEntry(
            user_id=request.user.pk,
            content_type_id=kind.pk,
            object_id=entry.id,
            object_repr=f"{entry.task_name}[{entry.task_id}]"[:200],
            action_flag=flag,
            change_message=message,
        )
        for entry in done
    ]
    for start in range(0, len(rows), _CHUNK):
        LogEntry.objects.bulk_create(rows[start : start + _CHUNK])
    shown = ", ".join(entry.id for entry in done[:LOGGED_IDS])
    more = f" and {len(done) - LOGGED_IDS} more" if len(done) > LOGGED_IDS else ""
    logger.warning(
        "%s %d parked task%s from the admin by %s (reason: %s): %s%s",
        what,
        len(done),
        "" if len(done) == 1 else "s",
        request.user.get_username(),
        reason or "none given",
        shown,
        more,
    )


def lever(request: Any, model: Any, name: str, what: str, reason: str) -> None:
    """Record a breaker lever (``what``: "Forced open", ...) on breaker ``name``."""
    from django.contrib.admin.models import CHANGE, LogEntry
    from django.contrib.contenttypes.models import ContentType

    kind = ContentType.objects.get_for_model(model, for_concrete_model=False)
    LogEntry.objects.create(
        user_id=request.user.pk,
        content_type_id=kind.pk,
        object_id=name,
        object_repr=f"breaker {name}"[:200],
        action_flag=CHANGE,
        change_message=_message(what, reason),
    )
