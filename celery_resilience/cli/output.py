"""What every command shares: options, the app's Resilience, tables, JSON, errors."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, TypeVar

import click
import redis
from kombu.exceptions import OperationalError

from ..errors import ConfigurationError, ResilienceError
from ..parked.codec import SEALED
from ..parked.entry import REASONS, STATUSES, ParkedTask
from ..parked.store import NO_BREAKER, dead_code
from ..redact import redact
from ..resilience import Resilience

F = TypeVar("F", bound=Callable[..., Any])
#: Shown in place of a field sealed by an encryption key this process does not have.
ENCRYPTED = "encrypted"

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
    """The entry's fields; read without the encryption key, the sealed ones say "encrypted"."""
    data = {name: getattr(entry, name) for name in entry.__dataclass_fields__}
    if entry.encrypted:
        data.update(dict.fromkeys(SEALED, ENCRYPTED))
    return data


def status_text(entry: ParkedTask) -> str:
    """``parked``, or ``dead (<reason code>)``: why it waits for a person."""
    return f"dead ({dead_code(entry.dead_reason)})" if entry.dead_reason else entry.status


def known_breaker(res: Resilience, name: str) -> None:
    known = sorted(set(res.breaker_names()) | (res.backout.breakers() - {NO_BREAKER}))
    if name not in known:
        fail(f"unknown breaker {name!r} (known: {', '.join(known) or 'none'})")


def breaker_filter(res: Resilience, breaker: str | None) -> None:
    """A ``--breaker`` no one knows is a typo: say so instead of showing an empty store."""
    if breaker is not None and breaker not in ("", NO_BREAKER, "none"):
        known_breaker(res, breaker)


def progress_wanted(as_json: bool, isatty: bool) -> bool:
    """A progress bar is for a person at a terminal: never beside ``--json``, nor into a pipe,
    a file or a log (where it would be noise between the results)."""
    return isatty and not as_json


def _ignore(steps: int) -> None:
    """``advance`` when no bar is drawn."""


class _AboveBar(logging.Handler):
    """The package's log lines (each replay logs one) over the bar's line instead of after it:
    the line is cleared, the record written, and the bar drawn again below at its next step."""

    def __init__(self, stream: Any) -> None:
        super().__init__(logging.WARNING)  # what Python prints when logging is not set up
        self.stream = stream

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.stream.write(f"\r\x1b[K{self.format(record)}\n")
            self.stream.flush()
        except Exception:
            self.handleError(record)


@contextmanager
def progress(
    as_json: bool, label: str, length: Callable[[], int]
) -> Iterator[Callable[[int], None]]:
    """``advance(n)`` of a bar on stderr (the results keep stdout), or of nothing.

    ``length`` is called only when a bar is drawn: counting may cost a round trip.
    """
    stream = click.get_text_stream("stderr")
    try:
        total = length() if progress_wanted(as_json, stream.isatty()) else 0
    except (ResilienceError, redis.RedisError):  # no bar: the command reports the outage
        total = 0
    if total <= 0:
        yield _ignore
        return
    bar = click.progressbar(length=total, label=label, file=stream, show_pos=True)
    ended = False

    def advance(steps: int) -> None:
        nonlocal ended
        if not ended:
            bar.update(steps)
            if bar.finished:  # end the line now: a log line written next must not join it
                bar.render_finish()
                ended = True

    package = logging.getLogger("celery_resilience")
    # Only in place of Python's last-resort output: handlers the app set up are left alone.
    above = None if package.hasHandlers() else _AboveBar(stream)
    if above is not None:
        package.addHandler(above)
    bar.render_progress()
    try:
        yield advance
    finally:
        if above is not None:
            package.removeHandler(above)
        if not ended:
            bar.render_finish()


def watch(show: Callable[[], None], interval: float, as_json: bool) -> None:
    """``show()`` every ``interval`` seconds until Ctrl-C, which ends it with exit code 0.

    On a terminal the screen is cleared first; elsewhere each refresh follows the last (a
    time line before each table; JSON documents one after another). An unreachable Redis is
    reported and tried again at the next refresh: a watch is for outages too.
    """
    try:
        while True:
            if not as_json:
                if click.get_text_stream("stdout").isatty():
                    click.clear()
                click.echo(f"{when(time.time())} UTC, every {interval:g}s (Ctrl-C to stop)")
            try:
                show()
            except (ResilienceError, redis.RedisError, OperationalError) as exc:
                click.echo(redact(f"Error: {type(exc).__name__}: {exc}"), err=True)
            time.sleep(interval)
    except KeyboardInterrupt:
        pass
