"""Commands that send parked tasks again: ``replay`` (a person's pick) and ``drain``."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
from celery.bin.base import CeleryCommand

from ..backout.entry import ParkedTask
from ..backout.lookup import find
from ..backout.store import NO_BREAKER
from ..drain.replay import COPY_WARNING, marked_copy
from ..errors import ResilienceError
from ..resilience import Resilience
from .entries import not_one, where_of
from .group import resilience
from .output import (
    breaker_filter,
    echo,
    emit,
    fail,
    filters,
    json_option,
    progress,
    resilience_of,
    when,
)


@resilience.command(cls=CeleryCommand)
@click.argument("keys", nargs=-1, metavar="[ID]...")
@click.option("--all", "replay_all", is_flag=True, help="Replay every entry that matches.")
@filters
@click.option("--yes", is_flag=True, help="Replay --all without asking.")
@click.option("--dry-run", is_flag=True, help="Say what would be replayed; send nothing.")
@json_option
@click.pass_context
def replay(
    ctx: click.Context,
    keys: tuple[str, ...],
    replay_all: bool,
    breaker: str | None,
    reason: str | None,
    status: str | None,
    yes: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Publish parked tasks now with their task ids, whatever their breaker says.

    Name entries as show does (entry id, unique prefix, Celery task id), or take every entry
    the filters match with --all, which asks first (--yes not to; without a terminal it needs
    --yes). --dry-run lists what would go and sends nothing.

    \b
    Examples:
      celery -A proj resilience replay 9e2898b7
      celery -A proj resilience replay --all --breaker payments --dry-run
      celery -A proj resilience replay --all --breaker payments --status dead --yes
    """
    res = resilience_of(ctx)
    if bool(keys) == replay_all:
        fail("give entry ids, or --all (with optional filters)")
    if replay_all:
        breaker_filter(res, breaker)
        if not (yes or dry_run):
            _confirm(res.runtime.backout_store.count(where_of(breaker, status, reason)))
        entries = _all(res, breaker, status, reason)
        missing: list[dict[str, str]] = []
    else:
        entries, missing = _named(res, keys)
    if dry_run:
        _dry_run(entries, missing, as_json)
        return
    replayed, failed = [], list(missing)
    with progress(as_json, "replaying", lambda: len(entries)) as advance:
        for entry in entries:
            try:
                sent = res.backout.replay(entry.id)
                done = {"id": entry.id, "task_id": sent.task_id, "task": sent.task_name}
                replayed.append({**done, "warning": COPY_WARNING} if marked_copy(entry) else done)
            except KeyError:
                failed.append({"id": entry.id, "error": "no parked task with this id"})
            except (ValueError, TimeoutError, ResilienceError) as exc:
                failed.append({"id": entry.id, "error": str(exc)})
            advance(1)
    emit(
        as_json,
        {"replayed": replayed, "failed": failed},
        lambda: "\n".join(
            [f"replayed {r['id']} -> {r['task']}[{r['task_id']}]" for r in replayed]
            + [f"{len(replayed)} replayed, {len(failed)} failed"]
        ),
    )
    for r in replayed:
        if "warning" in r:
            echo(f"Warning: replayed {r['id']}, but {r['warning']}", err=True)
    for f in failed:
        echo(f"Error: could not replay {f['id']}: {f['error']}", err=True)
    if failed:
        sys.exit(1)


def _confirm(count: int) -> None:
    """``--all`` replays whatever the breakers say: a person says yes first, a script --yes."""
    if not count:
        return
    question = f"Replay {count} parked task(s) now, whatever their breaker says?"
    if not sys.stdin.isatty():
        fail(f"this would replay {count} parked task(s); add --yes to do it (--dry-run lists them)")
    if not click.confirm(question, default=False, err=True):
        fail("nothing replayed")


def _named(res: Resilience, keys: tuple[str, ...]) -> tuple[list[ParkedTask], list[dict[str, str]]]:
    """The entries ``keys`` name (as ``show`` finds them), and the keys that name none or many."""
    entries: list[ParkedTask] = []
    missing: list[dict[str, str]] = []
    for key in keys:
        found = find(res.runtime.backout_store, key)
        if found.one is not None:
            entries.append(found.one)
        else:
            missing.append({"id": key, "error": not_one(found)})
    return entries, missing


def _dry_run(entries: list[ParkedTask], missing: list[dict[str, str]], as_json: bool) -> None:
    data = {
        "would_replay": [
            {"id": e.id, "task_id": e.task_id, "task": e.task_name, "breaker": e.breaker}
            for e in entries
        ],
        "failed": missing,
    }
    emit(
        as_json,
        data,
        lambda: "\n".join(
            [
                f"would replay {e.id} -> {e.task_name}[{e.task_id}] (breaker {e.breaker or '-'})"
                for e in entries
            ]
            + [f"{len(entries)} would be replayed (dry run: nothing sent)"]
        ),
    )
    for f in missing:
        echo(f"Error: could not replay {f['id']}: {f['error']}", err=True)
    if missing:
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


def _names(res: Resilience, breaker: str | None) -> list[str]:
    if breaker is None:
        return sorted(res.runtime.backout_store.breakers())
    return [NO_BREAKER if breaker in ("", "-", "none") else breaker]


def _due(res: Resilience, breaker: str | None, limit: int | None) -> int:
    """Entries due now that a drain may replay: the length of its progress bar (it ends short
    when a breaker holds some back)."""
    due = sum(res.runtime.backout_store.due(name) for name in _names(res, breaker))
    return due if limit is None else min(due, limit)


#: Breakers whose held-back entries a drain explains (each costs a read of the breaker).
HELD_EXPLAINED = 20


@resilience.command(cls=CeleryCommand)
@click.option("--breaker", help="Drain only this breaker ('-' for tasks without one).")
@click.option("--limit", type=int, help="Replay at most this many.")
@json_option
@click.pass_context
def drain(ctx: click.Context, breaker: str | None, limit: int | None, as_json: bool) -> None:
    """Replay due parked tasks of breakers that admit calls, at the configured rate.

    It prints one summary, and for each breaker that held entries back, why (open until when,
    forced open, half-open, a full bulkhead, --limit).

    \b
    Examples:
      celery -A proj resilience drain
      celery -A proj resilience drain --breaker payments --limit 500
      celery -A proj resilience drain --breaker - --json
    """
    res = resilience_of(ctx)
    breaker_filter(res, breaker)
    # One read first: a store that can't be reached is one line naming it, not a report.
    res.runtime.backout_store.breakers()
    with (
        progress(as_json, "draining", lambda: _due(res, breaker, limit)) as advance,
        _summary_printed_here(),
    ):
        report = res.drain(breaker=breaker, limit=limit, progress=advance)
    holding = sorted(
        ((name, stats["skipped"]) for name, stats in report.breakers.items() if stats["skipped"]),
        key=lambda pair: (-pair[1], pair[0]),
    )
    held = {  # the breakers holding most, each read once more (hosts may be thousands)
        name: {"entries": n, "why": held_back(res, name, limit, report.errors)}
        for name, n in holding[:HELD_EXPLAINED]
    }
    unexplained = holding[HELD_EXPLAINED:]
    data = {**report.as_dict(), "held_back": held}

    def human() -> str:
        if report.locked:
            return "another drain is running: nothing done"
        lines = [
            f"replayed {report.replayed}, dead {report.dead}, held back {report.skipped}, "
            f"errors {report.errors} in {report.duration:.2f}s"
        ]
        for name, h in held.items():
            whose = "tasks without a breaker" if name == NO_BREAKER else f"breaker {name!r}"
            lines.append(f"held back {h['entries']} of {whose}: {h['why']}")
        if unexplained:
            n = sum(count for _, count in unexplained)
            lines.append(f"held back {n} more, of {len(unexplained)} more breakers")
        return "\n".join(lines)

    emit(as_json, data, human)
    if report.errors:
        sys.exit(1)


def held_back(res: Resilience, name: str, limit: int | None, errors: int) -> str:
    """Why breaker ``name`` left due entries behind, read after the drain."""
    if name != NO_BREAKER:
        breaker = res.breaker(name)
        snap = breaker.snapshot()
        state = snap["state"]
        if state == "forced_open":
            return f"the breaker is forced open: 'close' or 'reset' {name} to let them go"
        if state == "open":
            return f"the breaker is open until {when(snap['open_until'])} UTC"
        if state == "half_open":
            return "the breaker is half-open: its probes decide"
        bulkhead = breaker.config.max_concurrent_calls
        if bulkhead is not None and int(snap["calls_in_flight"]) >= bulkhead:
            return f"the bulkhead is full ({snap['calls_in_flight']}/{bulkhead} calls in flight)"
    if errors:
        return "publishing failed: they are due again in a few seconds"
    if limit is not None:
        return f"--limit {limit} reached"
    return "they came due during the drain: the next one takes them"


class _DrainSummary(logging.Filter):
    """The drain logs its summary for workers; here the command prints it (once)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Drain: replayed=")


@contextmanager
def _summary_printed_here() -> Iterator[Any]:
    logger = logging.getLogger("celery_resilience.drain")
    quiet = _DrainSummary()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)
