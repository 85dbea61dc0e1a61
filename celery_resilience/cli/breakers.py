"""Commands on breakers and the whole picture: status, open, close, reset, metrics, check."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import click
from celery.bin.base import CeleryCommand

from ..checks import run_checks
from ..parked.store import NO_BREAKER, Filter
from ..parked.trust import UNTRUSTED
from ..task import resilient_tasks
from .group import resilience
from .output import emit, json_option, known_breaker, resilience_of, table, watch, when


@resilience.command(cls=CeleryCommand)
@json_option
@click.option("--watch", "watching", is_flag=True, help="Refresh until Ctrl-C.")
@click.option(
    "--interval",
    default=2.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Seconds between refreshes with --watch.",
)
@click.pass_context
def status(ctx: click.Context, as_json: bool, watching: bool, interval: float) -> None:
    """Every breaker: state, counts, open until; parked and dead tasks per breaker."""
    if watching:
        watch(lambda: _status(ctx, as_json), interval, as_json)
    else:
        _status(ctx, as_json)


def _status(ctx: click.Context, as_json: bool) -> None:
    res = resilience_of(ctx)
    store = res.backout_store
    names = sorted(set(res.breaker_names()) | (store.breakers() - {NO_BREAKER}))
    rows = []
    for name in names:
        breaker = res.breaker(name)
        snap = breaker.snapshot()
        snap["max_concurrent_calls"] = breaker.config.max_concurrent_calls
        snap["parked"] = store.count(Filter(name, "parked"))
        snap["dead"] = store.count(Filter(name, "dead"))
        rows.append((name, snap))
    unbroken = {
        "parked": store.count(Filter(NO_BREAKER, "parked")),
        "dead": store.count(Filter(NO_BREAKER, "dead")),
    }
    untrusted = _untrusted(store.stats())
    data = {"breakers": dict(rows), "no_breaker": unbroken, "untrusted_total": untrusted}

    def human() -> str:
        text = table(
            (
                "breaker",
                "state",
                "consecutive",
                "window",
                "opened",
                "open until",
                "bulkhead",
                "parked",
                "dead",
            ),
            [
                (
                    name,
                    s["state"],
                    s["consecutive_failures"],
                    f"{s['window_failures']}/{s['window_calls']} failed",
                    s["opened_total"],
                    when(s["open_until"]) if s["state"] in ("open", "half_open") else "-",
                    in_flight(s),
                    s["parked"],
                    s["dead"],
                )
                for name, s in rows
            ],
        )
        text += f"\nwithout breaker: {unbroken['parked']} parked, {unbroken['dead']} dead"
        if untrusted:
            counts = ", ".join(f"{n} {code}" for code, n in sorted(untrusted.items()))
            text += f"\nquarantined by drains, never published (ever): {counts}"
        return text

    emit(as_json, data, human)


def _untrusted(stats: dict[str, float]) -> dict[str, int]:
    """Entries drains quarantined because they failed the store's checks, by dead reason."""
    found: dict[str, int] = {}
    for key, value in stats.items():
        kind, _, rest = key.partition("|")
        code = rest.rpartition("|")[2]
        if kind == "dead_reason" and code in UNTRUSTED:
            found[code] = found.get(code, 0) + int(value)
    return found


def in_flight(snap: dict[str, Any]) -> str:
    """Calls in flight out of the bulkhead's limit (``2/4``), or ``-`` without a bulkhead."""
    limit = snap["max_concurrent_calls"]
    return "-" if limit is None else f"{snap['calls_in_flight']}/{limit}"


@resilience.command(cls=CeleryCommand)
@click.option("--port", default=9808, show_default=True, help="Port to serve /metrics on.")
@click.option("--addr", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.pass_context
def metrics(ctx: click.Context, port: int, addr: str) -> None:
    """Serve Prometheus metrics (breakers, parked tasks, drains) read from Redis."""
    from ..metrics import serve

    serve(resilience_of(ctx), port, addr)
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
    res = resilience_of(ctx)
    findings = run_checks(res.runtime, resilient_tasks(res.app))
    emit(
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
        res = resilience_of(ctx)
        known_breaker(res, name)
        breaker = res.breaker(name)
        {"open": breaker.force_open, "close": breaker.force_closed, "reset": breaker.reset}[
            action
        ]()
        snap = breaker.snapshot()
        emit(as_json, snap, lambda: f"breaker {name!r} is now {snap['state']}")

    return command


open_ = _steer("open", "Hold breaker NAME open (rejecting every call) until close or reset.")
close = _steer("close", "Hold breaker NAME closed (admitting every call) until reset.")
reset = _steer("reset", "Return breaker NAME to a fresh closed state.")
