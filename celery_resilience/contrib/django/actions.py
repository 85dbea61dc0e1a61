"""Replay and discard, shared by both admin pages: each reports back with ``message_user``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from django.contrib import messages
from django.utils.text import Truncator

from ...parked.view import Backout
from ...redact import get_logger

logger = get_logger("celery_resilience.admin")
#: Failures listed one by one in the error message; the rest are counted.
_SHOWN = 10


class Deletes(Protocol):
    def delete(self, entry_id: str) -> bool: ...


def _plural(count: int, singular: str, plural: str | None = None) -> str:
    return f"{count} {singular if count == 1 else plural or singular + 's'}"


def _report_failures(admin: Any, request: Any, verb: str, failures: list[str]) -> None:
    if not failures:
        return
    shown = "; ".join(failures[:_SHOWN])
    more = f"; and {len(failures) - _SHOWN} more" if len(failures) > _SHOWN else ""
    text = f"Could not {verb} {_plural(len(failures), 'entry', 'entries')}: {shown}{more}"
    admin.message_user(request, text, messages.ERROR)


def replay(admin: Any, request: Any, backout: Backout, entry_ids: Iterable[str]) -> int:
    """Publish each entry now with its task id (``Backout.replay``); the number replayed."""
    replayed, failures = 0, []
    for entry_id in entry_ids:
        try:
            backout.replay(entry_id)
        except KeyError:
            failures.append(f"{entry_id} is no longer in the store")
        except (ValueError, TimeoutError) as exc:  # undecodable, bad args, expired, locked
            failures.append(f"{entry_id}: {Truncator(str(exc)).chars(200)}")
        except Exception as exc:  # the broker refused: the entry stays parked
            logger.exception("Replay of %s from the admin failed", entry_id)
            failures.append(f"{entry_id}: {type(exc).__name__}: {Truncator(str(exc)).chars(200)}")
        else:
            replayed += 1
    if replayed:
        admin.message_user(
            request, f"Replayed {_plural(replayed, 'parked task')}.", messages.SUCCESS
        )
    _report_failures(admin, request, "replay", failures)
    return replayed


def discard(admin: Any, request: Any, backout: Deletes, entry_ids: Iterable[str]) -> int:
    """Delete each entry from the store; the number deleted."""
    discarded, failures = 0, []
    for entry_id in entry_ids:
        try:
            if backout.delete(entry_id):
                discarded += 1
            else:
                failures.append(f"{entry_id} is no longer in the store")
        except Exception as exc:  # the store is unreachable
            logger.exception("Discarding %s from the admin failed", entry_id)
            failures.append(f"{entry_id}: {type(exc).__name__}: {Truncator(str(exc)).chars(200)}")
    if discarded:
        admin.message_user(
            request, f"Discarded {_plural(discarded, 'parked task')}.", messages.SUCCESS
        )
    _report_failures(admin, request, "discard", failures)
    return discarded
