"""Commands on parked tasks: list, show, replay, drain, purge."""

from __future__ import annotations

import json
import sys

import click
from celery.bin.base import CeleryCommand

from ..errors import ResilienceError
from ..parked.entry import ParkedTask
from ..parked.store import NO_BREAKER
from ..redact import redact
from ..resilience import Resilience
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
    table,
    when,
)


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
    """Parked tasks, newest first."""
    if limit < 1 or page < 1:
        fail("--limit and --page must be >= 1")
    res = resilience_of(ctx)
    breaker_filter(res, breaker)
    entries = res.backout.list(breaker, status, limit, reason=reason, offset=(page - 1) * limit)

    def human() -> str:
        return table(
            (
                "id",
                "task",
                "task id",
                "breaker",
                "reason",
                "status",
                "retries",
                "replays",
                "parked",
            ),
            [
                (
                    e.id,
                    e.task_name,
                    e.task_id,
                    e.breaker or "-",
                    e.reason,
                    status_text(e),
                    e.retries,
                    e.replays,
                    when(e.parked_at),
                )
                for e in entries
            ],
        )

    emit(as_json, [entry_dict(e) for e in entries], human)


@resilience.command(cls=CeleryCommand)
@click.argument("entry_id")
@json_option
@click.pass_context
def show(ctx: click.Context, entry_id: str, as_json: bool) -> None:
    """One parked task, whole: args, kwargs, options, exception and traceback."""
    entry = resilience_of(ctx).backout.get(entry_id)
    if entry is None:
        fail(f"no parked task with id {entry_id!r}")
        return
    data = entry_dict(entry)

    def human() -> str:
        lines = [
            f"{k:>12}: {json.dumps(v, default=str)}" for k, v in data.items() if k != "traceback"
        ]
        trace = ENCRYPTED if entry.encrypted else entry.traceback or "    (none)"
        return "\n".join([*lines, "   traceback:", trace])

    emit(as_json, data, human)


@resilience.command(cls=CeleryCommand)
@click.argument("entry_ids", nargs=-1)
@click.option("--all", "replay_all", is_flag=True, help="Replay every entry that matches.")
@filters
@json_option
@click.pass_context
def replay(
    ctx: click.Context,
    entry_ids: tuple[str, ...],
    replay_all: bool,
    breaker: str | None,
    reason: str | None,
    status: str | None,
    as_json: bool,
) -> None:
    """Publish parked tasks now with their task ids, whatever their breaker says."""
    res = resilience_of(ctx)
    if bool(entry_ids) == replay_all:
        fail("give entry ids, or --all (with optional filters)")
    ids = list(entry_ids)
    if replay_all:
        breaker_filter(res, breaker)
        ids = [e.id for e in _all(res, breaker, status, reason)]
    replayed, failed = [], []
    with progress(as_json, "replaying", lambda: len(ids)) as advance:
        for entry_id in ids:
            try:
                entry = res.backout.replay(entry_id)
                replayed.append({"id": entry_id, "task_id": entry.task_id, "task": entry.task_name})
            except KeyError:
                failed.append({"id": entry_id, "error": "no parked task with this id"})
            except (ValueError, TimeoutError, ResilienceError) as exc:
                failed.append({"id": entry_id, "error": str(exc)})
            advance(1)
    emit(
        as_json,
        {"replayed": replayed, "failed": failed},
        lambda: "\n".join(
            [f"replayed {r['id']} -> {r['task']}[{r['task_id']}]" for r in replayed]
            + [f"{len(replayed)} replayed, {len(failed)} failed"]
        ),
    )
    for f in failed:
        click.echo(redact(f"Error: could not replay {f['id']}: {f['error']}"), err=True)
    if failed:
        sys.exit(1)


def _all(
    res: Resilience, breaker: str | None, status: str | None, reason: str | None
) -> list[ParkedTask]:
    entries: list[ParkedTask] = []
    page = 500
    while True:
        chunk = res.backout.list(breaker, status, page, reason=reason, offset=len(entries))
        entries.extend(chunk)
        if len(chunk) < page:
            return entries


def _due(res: Resilience, breaker: str | None, limit: int | None) -> int:
    """Entries due now that a drain may replay: the length of its progress bar (it ends short
    when a breaker holds some back)."""
    store = res.backout_store
    if breaker is None:
        names = sorted(store.breakers())
    else:
        names = [NO_BREAKER if breaker in ("", "-", "none") else breaker]
    due = sum(store.due(name) for name in names)
    return due if limit is None else min(due, limit)


@resilience.command(cls=CeleryCommand)
@click.option("--breaker", help="Drain only this breaker ('-' for tasks without one).")
@click.option("--limit", type=int, help="Replay at most this many.")
@json_option
@click.pass_context
def drain(ctx: click.Context, breaker: str | None, limit: int | None, as_json: bool) -> None:
    """Replay due parked tasks of breakers that admit calls, at the configured rate."""
    res = resilience_of(ctx)
    breaker_filter(res, breaker)
    with progress(as_json, "draining", lambda: _due(res, breaker, limit)) as advance:
        report = res.drain(breaker=breaker, limit=limit, progress=advance)
    data = report.as_dict()

    def human() -> str:
        if report.locked:
            return "another drain is running: nothing done"
        return (
            f"replayed {report.replayed}, dead {report.dead}, held back {report.skipped}, "
            f"errors {report.errors} in {report.duration:.2f}s"
        )

    emit(as_json, data, human)
    if report.errors:
        sys.exit(1)


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
    """Delete parked tasks that match the filters (all without filters). Needs --yes."""
    res = resilience_of(ctx)
    breaker_filter(res, breaker)
    if not yes:
        count = len(_all(res, breaker, status, reason))
        fail(f"this would delete {count} parked task(s); add --yes to do it")
    removed = res.backout.purge(breaker, status, reason)
    emit(as_json, {"purged": removed}, lambda: f"purged {removed} parked task(s)")
