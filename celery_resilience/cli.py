"""``celery -A proj resilience ...``: look at breakers and parked tasks, replay, drain, steer.

Registered through the ``celery.commands`` entry point, so it is a sub-command of ``celery``
with ``-A`` handled by Celery. Human tables by default, ``--json`` for scripts; exit code 1 on
error, with a clear message for unknown breakers and entry ids.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timezone
from typing import Any, TypeVar

import click
from celery.bin.base import CeleryCommand, handle_preload_options

from .backout.entry import REASONS, STATUSES, ParkedTask
from .backout.store import NO_BREAKER
from .errors import ConfigurationError, ResilienceError
from .resilience import Resilience

F = TypeVar("F", bound=Callable[..., Any])

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def _filters(fn: F) -> F:
    fn = click.option("--breaker", help="Only entries of this breaker ('-' for none).")(fn)
    fn = click.option("--reason", type=click.Choice(REASONS), help="Only entries parked so.")(fn)
    fn = click.option("--status", type=click.Choice(STATUSES), help="parked or dead.")(fn)
    return fn


def _resilience(ctx: click.Context) -> Resilience:
    try:
        return Resilience.for_app(ctx.obj.app)
    except ConfigurationError as exc:
        _fail(str(exc))
        raise  # unreachable: _fail exits


def _fail(message: str) -> None:
    click.echo(f"Error: {message}", err=True)
    sys.exit(1)


def _when(epoch: float | None) -> str:
    if not epoch:
        return "-"
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    cells = [[str(c) for c in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def _emit(as_json: bool, data: Any, human: Callable[[], str]) -> None:
    click.echo(json.dumps(data, indent=2, default=str) if as_json else human())


def _entry_dict(entry: ParkedTask) -> dict[str, Any]:
    return {name: getattr(entry, name) for name in entry.__dataclass_fields__}


def _known_breaker(res: Resilience, name: str) -> None:
    known = sorted(set(res.breaker_names()) | (res.backout.breakers() - {NO_BREAKER}))
    if name not in known:
        _fail(f"unknown breaker {name!r} (known: {', '.join(known) or 'none'})")


def _breaker_filter(res: Resilience, breaker: str | None) -> None:
    """A ``--breaker`` no one knows is a typo: say so instead of showing an empty store."""
    if breaker is not None and breaker not in ("", NO_BREAKER, "none"):
        _known_breaker(res, breaker)


@click.group(name="resilience")
@click.pass_context
@handle_preload_options  # type: ignore[untyped-decorator]
def resilience(ctx: click.Context) -> None:
    """Shared circuit breakers and parked tasks (celery-resilience)."""


@resilience.command(cls=CeleryCommand)
@json_option
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Every breaker: state, counts, open until; parked and dead tasks per breaker."""
    res = _resilience(ctx)
    store = res.backout_store
    names = sorted(set(res.breaker_names()) | (store.breakers() - {NO_BREAKER}))
    rows = []
    for name in names:
        snap = res.breaker(name).snapshot()
        snap["parked"] = store.count(name, "parked")
        snap["dead"] = store.count(name, "dead")
        rows.append((name, snap))
    unbroken = {
        "parked": store.count(NO_BREAKER, "parked"),
        "dead": store.count(NO_BREAKER, "dead"),
    }
    data = {"breakers": dict(rows), "no_breaker": unbroken}

    def human() -> str:
        table = _table(
            ("breaker", "state", "consecutive", "window", "opened", "open until", "parked", "dead"),
            [
                (
                    name,
                    s["state"],
                    s["consecutive_failures"],
                    f"{s['window_failures']}/{s['window_calls']} failed",
                    s["opened_total"],
                    _when(s["open_until"]) if s["state"] in ("open", "half_open") else "-",
                    s["parked"],
                    s["dead"],
                )
                for name, s in rows
            ],
        )
        return f"{table}\nwithout breaker: {unbroken['parked']} parked, {unbroken['dead']} dead"

    _emit(as_json, data, human)


@resilience.command(name="list", cls=CeleryCommand)
@_filters
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
        _fail("--limit and --page must be >= 1")
    res = _resilience(ctx)
    _breaker_filter(res, breaker)
    entries = res.backout.list(breaker, status, limit, reason=reason, offset=(page - 1) * limit)

    def human() -> str:
        return _table(
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
                    e.status,
                    e.retries,
                    e.replays,
                    _when(e.parked_at),
                )
                for e in entries
            ],
        )

    _emit(as_json, [_entry_dict(e) for e in entries], human)


@resilience.command(cls=CeleryCommand)
@click.argument("entry_id")
@json_option
@click.pass_context
def show(ctx: click.Context, entry_id: str, as_json: bool) -> None:
    """One parked task, whole: args, kwargs, options, exception and traceback."""
    entry = _resilience(ctx).backout.get(entry_id)
    if entry is None:
        _fail(f"no parked task with id {entry_id!r}")
        return
    data = _entry_dict(entry)

    def human() -> str:
        lines = [
            f"{k:>12}: {json.dumps(v, default=str)}" for k, v in data.items() if k != "traceback"
        ]
        return "\n".join([*lines, "   traceback:", entry.traceback or "    (none)"])

    _emit(as_json, data, human)


@resilience.command(cls=CeleryCommand)
@click.argument("entry_ids", nargs=-1)
@click.option("--all", "replay_all", is_flag=True, help="Replay every entry that matches.")
@_filters
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
    res = _resilience(ctx)
    if bool(entry_ids) == replay_all:
        _fail("give entry ids, or --all (with optional filters)")
    ids = list(entry_ids)
    if replay_all:
        _breaker_filter(res, breaker)
        ids = [e.id for e in _all(res, breaker, status, reason)]
    replayed, failed = [], []
    for entry_id in ids:
        try:
            entry = res.backout.replay(entry_id)
            replayed.append({"id": entry_id, "task_id": entry.task_id, "task": entry.task_name})
        except KeyError:
            failed.append({"id": entry_id, "error": "no parked task with this id"})
        except (ValueError, TimeoutError, ResilienceError) as exc:
            failed.append({"id": entry_id, "error": str(exc)})
    _emit(
        as_json,
        {"replayed": replayed, "failed": failed},
        lambda: "\n".join(
            [f"replayed {r['id']} -> {r['task']}[{r['task_id']}]" for r in replayed]
            + [f"{len(replayed)} replayed, {len(failed)} failed"]
        ),
    )
    for f in failed:
        click.echo(f"Error: could not replay {f['id']}: {f['error']}", err=True)
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


@resilience.command(cls=CeleryCommand)
@click.option("--breaker", help="Drain only this breaker ('-' for tasks without one).")
@click.option("--limit", type=int, help="Replay at most this many.")
@json_option
@click.pass_context
def drain(ctx: click.Context, breaker: str | None, limit: int | None, as_json: bool) -> None:
    """Replay due parked tasks of breakers that admit calls, at the configured rate."""
    res = _resilience(ctx)
    _breaker_filter(res, breaker)
    report = res.drain(breaker=breaker, limit=limit)
    data = report.as_dict()

    def human() -> str:
        if report.locked:
            return "another drain is running: nothing done"
        return (
            f"replayed {report.replayed}, dead {report.dead}, held back {report.skipped}, "
            f"errors {report.errors} in {report.duration:.2f}s"
        )

    _emit(as_json, data, human)
    if report.errors:
        sys.exit(1)


@resilience.command(cls=CeleryCommand)
@_filters
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
    res = _resilience(ctx)
    _breaker_filter(res, breaker)
    if not yes:
        count = len(_all(res, breaker, status, reason))
        _fail(f"this would delete {count} parked task(s); add --yes to do it")
    removed = res.backout.purge(breaker, status, reason)
    _emit(as_json, {"purged": removed}, lambda: f"purged {removed} parked task(s)")


@resilience.command(cls=CeleryCommand)
@click.option("--port", default=9808, show_default=True, help="Port to serve /metrics on.")
@click.option("--addr", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.pass_context
def metrics(ctx: click.Context, port: int, addr: str) -> None:
    """Serve Prometheus metrics (breakers, parked tasks, drains) read from Redis."""
    from .metrics import serve

    serve(_resilience(ctx), port, addr)
    click.echo(f"serving celery-resilience metrics on http://{addr}:{port}/metrics")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass


@resilience.command(cls=CeleryCommand)
@json_option
@click.pass_context
def check(ctx: click.Context, as_json: bool) -> None:
    """Look for settings and Redis setups that can lose work; exit 1 on an error."""
    from .checks import run_checks

    findings = run_checks(_resilience(ctx))
    _emit(
        as_json,
        [{"level": f.level, "message": f.message} for f in findings],
        lambda: "\n".join(f"{f.level.upper()}: {f.message}" for f in findings) or "all good",
    )
    if any(f.level == "error" for f in findings):
        sys.exit(1)


def _steer(action: str, help_text: str) -> Callable[..., None]:
    @resilience.command(name=action, cls=CeleryCommand, help=help_text)
    @click.argument("name")
    @json_option
    @click.pass_context
    def command(ctx: click.Context, name: str, as_json: bool) -> None:
        res = _resilience(ctx)
        _known_breaker(res, name)
        breaker = res.breaker(name)
        {"open": breaker.force_open, "close": breaker.force_closed, "reset": breaker.reset}[
            action
        ]()
        snap = breaker.snapshot()
        _emit(as_json, snap, lambda: f"breaker {name!r} is now {snap['state']}")

    return command


open_ = _steer("open", "Hold breaker NAME open (rejecting every call) until close or reset.")
close = _steer("close", "Hold breaker NAME closed (admitting every call) until reset.")
reset = _steer("reset", "Return breaker NAME to a fresh closed state.")
