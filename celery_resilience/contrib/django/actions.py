"""Replay, discard and re-check, shared by both admin pages: a confirmation page first, then
the work, reported back with ``message_user`` and recorded (``audit.py``) with the user and the
reason."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from django.contrib import messages
from django.contrib.admin.models import CHANGE, DELETION
from django.template.response import TemplateResponse
from django.utils.text import Truncator

from ...backout.entry import ParkedTask
from ...backout.facade import Backout
from ...backout.masking import EVERYTHING
from ...drain.replay import COPY_WARNING, marked_copy
from ...known_tasks import masking_of
from ...redact import get_logger
from ...repair import repair
from . import audit
from .display import ACTION_FIELD, DISCARD, RECHECK, SELECTED_FIELD, error
from .holding import breaker_states, warnings
from .search import SCAN_LIMIT

logger = get_logger("celery_resilience.admin")
#: Failures listed one by one in the error message; the rest are counted.
_SHOWN = 10
#: Entries listed on a confirmation page; the rest are counted.
SAMPLE = 20
#: POST fields of the confirmation page.
CONFIRMED, REASON, ACROSS = "post", "reason", "select_across"


class Deletes(Protocol):
    def delete(self, entry_id: str) -> bool: ...


@dataclass
class Target:
    """What an action covers: the entries, and how they were chosen (for the page's words)."""

    entries: list[ParkedTask]
    across: bool = False  # every entry the filter matches, not only the ticked ones
    cut: bool = False  # the filter's scan stopped at ``SCAN_LIMIT``
    missing: int = 0  # ticked ids no longer in the store


def _plural(count: int, singular: str, plural: str | None = None) -> str:
    return f"{count} {singular if count == 1 else plural or singular + 's'}"


def _report_failures(admin: Any, request: Any, verb: str, failures: list[str]) -> None:
    if not failures:
        return
    shown = "; ".join(failures[:_SHOWN])
    more = f"; and {len(failures) - _SHOWN} more" if len(failures) > _SHOWN else ""
    text = f"Could not {verb} {_plural(len(failures), 'entry', 'entries')}: {shown}{more}"
    admin.message_user(request, text, messages.ERROR)


def confirm(
    admin: Any,
    request: Any,
    action: str,
    target: Target,
    res: Any,
    extra: dict[str, Any],
) -> TemplateResponse:
    """The page that asks before a replay or discard: how many, which (the first ``SAMPLE``),
    what happens to them, which breakers would park them again; a reason; yes or no."""
    from .display import ARGS_WIDTH
    from .display import summary as row

    entries, discard, recheck = target.entries, action == DISCARD, action == RECHECK
    count = len(entries)
    masking = masking_of(res.runtime) if res is not None else EVERYTHING
    states = {} if discard or recheck or res is None else breaker_states(res, entries)
    per_breaker = Counter(entry.breaker or "" for entry in entries)
    noun = _plural(count, "parked task")
    verb = "Discard" if discard else "Re-check" if recheck else "Replay"
    context = {
        **admin.admin_site.each_context(request),
        "opts": admin.opts,
        "title": f"{verb} {noun}?",
        "discard": discard,
        "recheck": recheck,
        "count": count,
        "noun": noun,
        "across": target.across,
        "cut": target.cut,
        "scan_limit": SCAN_LIMIT,
        "missing": target.missing,
        "sample": [
            {**row(entry, 0.0, masking), "error": error(entry, masking), "width": ARGS_WIDTH}
            for entry in entries[:SAMPLE]
        ],
        "more": max(0, count - SAMPLE),
        "warnings": warnings(states, per_breaker),
        "action_field": ACTION_FIELD,
        "action": action,
        "selected_field": SELECTED_FIELD,
        "selected": [] if target.across else [entry.id for entry in entries],
        "across_field": ACROSS,
        "confirmed_field": CONFIRMED,
        "reason_field": REASON,
        **extra,
    }
    return TemplateResponse(request, "admin/celery_resilience/entries_confirm.html", context)


def replay(
    admin: Any,
    request: Any,
    backout: Backout,
    entries: Sequence[ParkedTask],
    reason: str = "",
    model: Any = None,
) -> int:
    """Publish each entry now with its task id (``Backout.replay``); the number replayed.

    A drain holding its lock past a replay's wait stops the run (each next one would wait as
    long): the rest stay parked, and the message says how many."""
    done, failures = [], []
    for index, entry in enumerate(entries):
        entry_id = entry.id
        try:
            backout.replay(entry_id)
        except KeyError:
            failures.append(f"{entry_id} is no longer in the store")
        except TimeoutError as exc:  # a drain holds the lock: try again in a moment
            left = len(entries) - index
            failures.append(f"{exc}: {_plural(left, 'entry', 'entries')} left parked")
            break
        except ValueError as exc:  # undecodable, bad args, expired
            failures.append(f"{entry_id}: {Truncator(str(exc)).chars(200)}")
        except Exception as exc:  # the broker refused: the entry stays parked
            logger.exception("Replay of %s from the admin failed", entry_id)
            failures.append(f"{entry_id}: {type(exc).__name__}: {Truncator(str(exc)).chars(200)}")
        else:
            done.append(entry)
    audit.entries(request, model or admin.model, done, "Replayed", reason, CHANGE)
    if done:
        admin.message_user(
            request, f"Replayed {_plural(len(done), 'parked task')}.", messages.SUCCESS
        )
    copies = [e.id for e in done if marked_copy(e)]
    if copies:
        shown = ", ".join(copies[:_SHOWN]) + (" and more" if len(copies) > _SHOWN else "")
        admin.message_user(request, f"{shown}: {COPY_WARNING}.", messages.WARNING)
    _report_failures(admin, request, "replay", failures)
    return len(done)


def discard(
    admin: Any,
    request: Any,
    backout: Deletes,
    entries: Sequence[ParkedTask],
    reason: str = "",
    model: Any = None,
) -> int:
    """Delete each entry from the store; the number deleted."""
    done, failures = [], []
    for entry in entries:
        entry_id = entry.id
        try:
            if backout.delete(entry_id):
                done.append(entry)
            else:
                failures.append(f"{entry_id} is no longer in the store")
        except Exception as exc:  # the store is unreachable
            logger.exception("Discarding %s from the admin failed", entry_id)
            failures.append(f"{entry_id}: {type(exc).__name__}: {Truncator(str(exc)).chars(200)}")
    audit.entries(request, model or admin.model, done, "Discarded", reason, DELETION)
    if done:
        admin.message_user(
            request, f"Discarded {_plural(len(done), 'parked task')}.", messages.SUCCESS
        )
    _report_failures(admin, request, "discard", failures)
    return len(done)


def recheck(
    admin: Any,
    request: Any,
    store: Any,
    entries: Sequence[ParkedTask],
    reason: str = "",
    model: Any = None,
) -> int:
    """Sign again and park again, due now (Redis's time), the dead entries the app's process
    reads and verifies (``repair``: their dead reason says another process could not); the
    number parked again. The others are listed with this process's reason."""
    from ...backout.store import dead_code
    from ...repair import REPAIRABLE
    from .conf import resilience

    try:
        runtime = resilience().runtime
    except Exception as exc:
        admin.message_user(request, f"No usable Celery app: {exc}", messages.ERROR)
        return 0
    chosen = [e for e in entries if e.status == "dead" and dead_code(e.dead_reason) in REPAIRABLE]
    skipped = len(entries) - len(chosen)
    report = repair(store, runtime.codec(), chosen, runtime.now())
    audit.entries(request, model or admin.model, report.revived, "Re-checked", reason, CHANGE)
    if report.revived:
        text = f"Parked again {_plural(len(report.revived), 'entry', 'entries')}: they read here."
        admin.message_user(request, text, messages.SUCCESS)
    if skipped:
        admin.message_user(
            request,
            f"{_plural(skipped, 'entry', 'entries')} left alone: not dead for a reason a "
            "re-check can change (undecodable, unsigned, tampered, undecryptable).",
            messages.WARNING,
        )
    refusals = [f"{i}: {Truncator(why).chars(200)}" for i, why in report.refused.items()]
    _report_failures(admin, request, "park again", refusals)
    return len(report.revived)
