"""Commands on parked tasks: list, show (an entry found by id, prefix or task id), purge."""

from __future__ import annotations

import json
from typing import cast

import click
from celery.bin.base import CeleryCommand

from ..backout.entry import Reason, Status
from ..backout.lookup import CANDIDATES, Found, find
from ..backout.store import Filter
from ..known_tasks import masking_of
from .group import resilience
from .output import (
    ENCRYPTED,
    breaker_filter,
    emit,
    entry_dict,
    fail,
    filters,
    json_option,
    progress,
    resilience_of,
    status_text,
    when,
)
from .rows import rows

#: Fields of an entry that are epoch seconds.
TIMES = ("parked_at", "due_at")


@resilience.command(name="list", cls=CeleryCommand)
@filters
@click.option("--limit", default=50, show_default=True, help="Entries per page.")
@click.option("--page", default=1, show_default=True, help="Page number (newest first).")
@json_option
@click.pass_context
def list_(
    ctx: click.Context,
    breaker: str | None,
    reason: str | None,
    status: str | None,
    limit: int,
    page: int,
    as_json: bool,
) -> None:
    """Parked tasks, newest first, one a line within 120 columns: the first characters of the
    entry id (show takes them), when it was parked (UTC), task, breaker, reason (or dead),
    the arguments (masked) and the error (for a dead entry, why it is dead).

    \b
    Examples:
      celery -A proj resilience list
      celery -A proj resilience list --breaker payments --status dead
      celery -A proj resilience list --reason retries_exhausted --limit 20 --page 2
    """
    if limit < 1 or page < 1:
        fail("--limit and --page must be >= 1")
    res = resilience_of(ctx)
    breaker_filter(res, breaker)
    entries = res.backout.list(breaker, status, limit, reason=reason, offset=(page - 1) * limit)
    masking = masking_of(res.runtime)

    def human() -> str:
        total = res.runtime.backout_store.count(where_of(breaker, status, reason))
        return rows(entries, masking) + "\n" + page_line(len(entries), total, page, limit)

    emit(as_json, [entry_dict(e, masking) for e in entries], human)


def page_line(shown: int, total: int, page: int, limit: int) -> str:
    """``51-100 of 2030 (page 2 of 41); next: --page 3``: where this page is, what comes next."""
    pages = max(1, -(-total // limit))
    if not shown:
        return f"none of {total}" + (f" on page {page} (the last is {pages})" if total else "")
    first = (page - 1) * limit + 1
    text = f"{first}-{first + shown - 1} of {total} (page {page} of {pages})"
    return text + (f"; next: --page {page + 1}" if page < pages else "")


@resilience.command(cls=CeleryCommand)
@click.argument("key", metavar="ID")
@json_option
@click.pass_context
def show(ctx: click.Context, key: str, as_json: bool) -> None:
    """One parked task, whole: args, kwargs, options, exception and traceback.

    ID is the entry id, a unique prefix of it (what list shows), or the Celery task id (what
    Flower and the logs give). Times are UTC; the values of arguments named in
    resilience_sensitive_keys (by keyword or by position) are masked, in the error and the
    traceback too, here and in --json; control characters of stored text are escaped.

    \b
    Examples:
      celery -A proj resilience show 9e2898b7
      celery -A proj resilience show e878c0e5-8602-4bba-aa8e-d35c8f38ee37
      celery -A proj resilience show 9e2898b7 --json
    """
    res = resilience_of(ctx)
    found = find(res.runtime.backout_store, key)
    entry = found.one
    if entry is None:
        fail(not_one(found))
        return
    data = entry_dict(entry, masking_of(res.runtime))

    def human() -> str:
        lines = [f"{k:>12}: {shown(k, v)}" for k, v in data.items() if k != "traceback"]
        trace = ENCRYPTED if entry.encrypted else data["traceback"] or "    (none)"
        return "\n".join([*lines, "   traceback:", trace])

    emit(as_json, data, human)


def shown(name: str, value: object) -> str:
    """A field of ``show``: times in UTC, the rest as JSON."""
    if name in TIMES and isinstance(value, (int, float)):
        return f"{when(value)} UTC"
    return json.dumps(value, default=str, ensure_ascii=False)


def not_one(found: Found) -> str:
    """Why ``found`` is not one entry: none matched, or which ones did."""
    if not found.entries:
        return f"no parked task with id, id prefix or task id {found.key!r}"
    many = len(found.entries)
    more = "+" if many >= CANDIDATES else ""
    lines = [f"{found.key!r} is ambiguous: {many}{more} entries match by {found.by}; give one id:"]
    lines += [
        f"  {e.id}  {e.task_name}[{e.task_id}]  {status_text(e)}  parked {when(e.parked_at)} UTC"
        for e in found.entries
    ]
    return "\n".join(lines)


def where_of(breaker: str | None, status: str | None, reason: str | None) -> Filter:
    """The filter ``Backout.list`` and ``Backout.purge`` make of the command's options (click's
    choices checked status and reason)."""
    return Filter(breaker, cast("Status | None", status), cast("Reason | None", reason))


@resilience.command(cls=CeleryCommand)
@filters
@click.option("--yes", is_flag=True, help="Really delete: there is no undo.")
@json_option
@click.pass_context
def purge(
    ctx: click.Context,
    breaker: str | None,
    reason: str | None,
    status: str | None,
    yes: bool,
    as_json: bool,
) -> None:
    """Delete parked tasks that match the filters (all without filters). Needs --yes:
    without it, it says how many it would delete. There is no undo.

    \b
    Examples:
      celery -A proj resilience purge --breaker payments --status dead
      celery -A proj resilience purge --breaker payments --status dead --yes
      celery -A proj resilience purge --reason redelivered --yes
    """
    res = resilience_of(ctx)
    breaker_filter(res, breaker)
    where = where_of(breaker, status, reason)
    if not yes:  # counted, not listed: a store of millions answers at once
        count = res.runtime.backout_store.count(where)
        fail(f"this would delete {count} parked task(s); add --yes to do it")
    # In batches (each atomic), so Ctrl-C leaves whole entries only; the bar counts them.
    with progress(as_json, "purging", lambda: res.runtime.backout_store.count(where)) as advance:
        removed = res.runtime.backout_store.purge(where, advance)
    emit(as_json, {"purged": removed}, lambda: f"purged {removed} parked task(s)")
