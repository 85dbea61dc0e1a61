"""What every command shares: options, the app's Resilience, tables, JSON, errors."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timezone
from typing import Any, TypeVar

import click

from ..errors import ConfigurationError
from ..parked.entry import REASONS, STATUSES, ParkedTask
from ..parked.store import NO_BREAKER
from ..redact import redact
from ..resilience import Resilience

F = TypeVar("F", bound=Callable[..., Any])

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def filters(fn: F) -> F:
    fn = click.option("--breaker", help="Only entries of this breaker ('-' for none).")(fn)
    fn = click.option("--reason", type=click.Choice(REASONS), help="Only entries parked so.")(fn)
    fn = click.option("--status", type=click.Choice(STATUSES), help="parked or dead.")(fn)
    return fn


def resilience_of(ctx: click.Context) -> Resilience:
    try:
        return Resilience.for_app(ctx.obj.app)
    except ConfigurationError as exc:
        fail(str(exc))
        raise  # unreachable: fail exits


def fail(message: str) -> None:
    click.echo(redact(f"Error: {message}"), err=True)
    sys.exit(1)


def when(epoch: float | None) -> str:
    if not epoch:
        return "-"
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    cells = [[str(c) for c in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def emit(as_json: bool, data: Any, human: Callable[[], str]) -> None:
    """Print ``data`` as JSON, or ``human()``; credentials in either are masked."""
    click.echo(redact(json.dumps(data, indent=2, default=str) if as_json else human()))


def entry_dict(entry: ParkedTask) -> dict[str, Any]:
    return {name: getattr(entry, name) for name in entry.__dataclass_fields__}


def known_breaker(res: Resilience, name: str) -> None:
    known = sorted(set(res.breaker_names()) | (res.backout.breakers() - {NO_BREAKER}))
    if name not in known:
        fail(f"unknown breaker {name!r} (known: {', '.join(known) or 'none'})")


def breaker_filter(res: Resilience, breaker: str | None) -> None:
    """A ``--breaker`` no one knows is a typo: say so instead of showing an empty store."""
    if breaker is not None and breaker not in ("", NO_BREAKER, "none"):
        known_breaker(res, breaker)
