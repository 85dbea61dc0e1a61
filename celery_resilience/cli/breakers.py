"""Commands on breakers and the whole picture: status, open, close, reset."""

from __future__ import annotations

import getpass
import socket
from collections.abc import Callable
from typing import Any, cast

import click
from celery.bin.base import CeleryCommand

from ..backout.store import NO_BREAKER, Filter
from ..backout.trust import UNTRUSTED
from ..breaker_listing import listing
from ..maintenance import LeverAction, pull
from ..redact import get_logger
from ..versions import version_notes
from .group import resilience
from .output import (
    emit,
    json_option,
    known_breaker,
    resilience_of,
    table,
    watch,
    when,
)

logger = get_logger("celery_resilience.cli")


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
    """Every breaker: state, counts, open until (UTC); parked and dead tasks per breaker.

    \b
    Examples:
      celery -A proj resilience status
      celery -A proj resilience status --watch --interval 5
      celery -A proj resilience status --json | jq '.breakers.payments.state'
    """
    if watching:
        watch(lambda: _status(ctx, as_json), interval, as_json)
    else:
        _status(ctx, as_json)


def _status(ctx: click.Context, as_json: bool) -> None:
    res = resilience_of(ctx)
    store = res.runtime.backout_store
    shown = listing(res.runtime)
    names = shown.names
    rows = []
    for name in names:
        breaker = res.breaker(name)
        snap = breaker.snapshot()
        snap["max_concurrent_calls"] = breaker.config.max_concurrent_calls
        snap["retry_budget"] = breaker.config.retry_budget
        snap["min_retries_per_second"] = breaker.config.min_retries_per_second
        snap["rate_limit"] = breaker.config.rate_limit
        snap["parked"] = store.count(Filter(name, "parked"))
        snap["dead"] = store.count(Filter(name, "dead"))
        rows.append((name, snap))
    unbroken = {
        "parked": store.count(Filter(NO_BREAKER, "parked")),
        "dead": store.count(Filter(NO_BREAKER, "dead")),
    }
    untrusted = _untrusted(store.stats())
    held = store.held_entries()
    notes = version_notes()
    families = {
        base: {
            "members": f.members,
            "troubled": f.troubled,
            "holding": f.holding,
            "shown": f.shown,
            "hidden": f.hidden,
        }
        for base, f in shown.families.items()
    }
    data = {
        "breakers": dict(rows),
        "derived": families,
        "no_breaker": unbroken,
        "untrusted_total": untrusted,
        "held": {code: {"entries": n, "oldest_parked_at": at} for code, (n, at) in held.items()},
        # What `check` warns about, and the news it keeps for --verbose: this process's own.
        "versions": [{"level": n.level, "message": n.message} for n in notes],
    }

    def human() -> str:
        text = table(
            (
                "breaker",
                "state",
                "consecutive",
                "window",
                "opened",
                "open until (UTC)",
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
        for name, s in rows:
            if s["retry_budget"] is not None:
                text += "\n" + budget_line(name, s)
            if s["rate_limit"] is not None:
                text += "\n" + rate_line(name, s)
        for base, f in shown.families.items():
            text += (
                f"\n{base}:*: {f.members} derived breakers with state, {f.troubled} troubled,"
                f" {f.holding} holding parked tasks; {f.hidden} more not shown"
            )
        text += f"\nwithout breaker: {unbroken['parked']} parked, {unbroken['dead']} dead"
        if untrusted:
            counts = ", ".join(f"{n} {code}" for code, n in sorted(untrusted.items()))
            text += f"\nquarantined by drains, never published (ever): {counts}"
        if held:
            counts = ", ".join(
                f"{n} {code} (oldest parked {when(at)} UTC)"
                for code, (n, at) in sorted(held.items())
            )
            text += f"\nheld for a process that can read them: {counts}"
        for note in notes:
            text += f"\nversions ({note.level}): {note.message}"
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


def budget_line(name: str, snap: dict[str, Any]) -> str:
    """A breaker's retry budget, its retries in the window and the retries it refused."""
    return (
        f"{name}: retry budget {snap['retry_budget']:.0%} + {snap['min_retries_per_second']:g}/s,"
        f" {snap['window_retries']} retries in the window,"
        f" {snap['retry_budget_refused_total']} refused (parked)"
    )


def rate_line(name: str, snap: dict[str, Any]) -> str:
    """A breaker's fleet-wide rate limit and the calls it turned away."""
    return (
        f"{name}: rate limit {snap['rate_limit']} fleet-wide,"
        f" {snap['rate_limited_total']} calls turned away (tasks wait in the broker)"
    )


#: What each lever does, as a log line says it.
DONE = {"open": "forced open", "close": "forced closed", "reset": "reset"}


def _steer(action: str, help_text: str) -> Callable[..., None]:
    examples = (
        f"\n\n\b\nExamples:\n  celery -A proj resilience {action} payments\n"
        f'  celery -A proj resilience {action} payments --reason "{_EXAMPLE_REASON[action]}"'
    )

    @resilience.command(name=action, cls=CeleryCommand, help=help_text + examples)
    @click.argument("name")
    @click.option(
        "--reason", help="Why (logged with who and where, and shown in the output and --json)."
    )
    @json_option
    @click.pass_context
    def command(ctx: click.Context, name: str, reason: str | None, as_json: bool) -> None:
        res = resilience_of(ctx)
        known_breaker(res, name)
        breaker = res.breaker(name)
        # A person's lever ends a maintenance window set from the admin, in the same step: the
        # beat drain task must not reset, at that window's end, a breaker steered since.
        pull(res.runtime, name, cast(LeverAction, action))
        who = f"{_user()}@{socket.gethostname()}"
        logger.warning(
            "Breaker %r %s from the command line by %s: %s",
            name,
            DONE[action],
            who,
            reason or "no reason given",
        )
        snap = breaker.snapshot()
        data = {**snap, "reason": reason, "by": who}
        said = f" ({reason})" if reason else ""
        emit(as_json, data, lambda: f"breaker {name!r} is now {snap['state']}{said}")

    return command


_EXAMPLE_REASON = {
    "open": "gateway maintenance until 03:00 UTC",
    "close": "the gateway is fine, the breaker trips on our timeouts",
    "reset": "maintenance over",
}


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name in this environment (a container without passwd)
        return "unknown"


open_ = _steer(
    "open", "Hold breaker NAME open (rejecting every call, parking tasks) until close or reset."
)
close = _steer("close", "Hold breaker NAME closed (admitting every call) until reset.")
reset = _steer("reset", "Return breaker NAME to a fresh closed state.")
