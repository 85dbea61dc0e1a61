"""What every command shares: options, the app's Resilience, tables, JSON, errors."""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, TypeVar

import click
import redis
from kombu.exceptions import OperationalError

from ..backout.codec import SEALED
from ..backout.entry import REASONS, STATUSES, ParkedTask
from ..backout.masking import SHOW_ALL, Masking
from ..backout.store import NO_BREAKER, dead_code
from ..breaker_listing import is_known, listing
from ..errors import ConfigurationError, ResilienceError
from ..redact import MASK, is_secret_name, masked_value, redact
from ..resilience import Resilience
from ..runtime import Runtime

F = TypeVar("F", bound=Callable[..., Any])
#: What a terminal acts on instead of printing, in stored text (an error's message, a task's
#: arguments): C0 controls but tab and newline (ESC starts CSI and OSC sequences: colours, a
#: clipboard write, a window title), DEL, C1 controls (CSI and OSC in one byte), and the
#: bidirectional marks, embeddings, overrides and isolates that reorder what follows them.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
#: Shown in place of a field sealed by an encryption key this process does not have.
ENCRYPTED = "encrypted"

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def filters(fn: F) -> F:
    fn = click.option("--breaker", help="Only entries of this breaker ('-' for none).")(fn)
    fn = click.option("--reason", type=click.Choice(REASONS), help="Only entries parked so.")(fn)
    fn = click.option("--status", type=click.Choice(STATUSES), help="parked or dead.")(fn)
    return fn


#: What a command says when ``celery`` was given no app: Celery's empty default app has no
#: settings, and its errors would blame settings the user never meant to leave out.
NO_APP = (
    "no Celery app given: name yours with -A (celery -A proj resilience ...), "
    "or set the CELERY_APP environment variable"
)


def app_of(ctx: click.Context) -> Any:
    """The app ``celery -A`` loaded; a clear error without ``-A`` (nor ``--config``)."""
    root = ctx.find_root().params
    if root.get("app") is None and root.get("config") is None:
        fail(NO_APP)
    return ctx.obj.app


def resilience_of(ctx: click.Context) -> Resilience:
    app = app_of(ctx)
    try:
        return Resilience.for_app(app)
    except ConfigurationError as exc:
        fail(str(exc))
        raise  # unreachable: fail exits


def outage(exc: BaseException, app: Any) -> str:
    """One line for a Redis, store or broker error, naming the server it was about (credentials
    masked): a connection error alone often says only "Connection refused"."""
    where = ""
    try:
        if isinstance(exc, OperationalError):
            where = f" (broker at {masked_value(app.conf.broker_url)})"
        elif _from_redis(exc) and not (config := Runtime.for_app(app).config).in_memory:
            where = f" (Redis at {masked_value(config.redis_url)})"
    except Exception:  # no app, bad settings: the error alone is said
        where = ""
    return printable(redact(f"Error: {type(exc).__name__}: {exc}{where}"))


def _from_redis(exc: BaseException | None) -> bool:
    """Whether ``exc`` is Redis's error, or was caused by one (``StoreUnavailable`` wraps it)."""
    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, redis.RedisError):
            return True
        exc, seen = exc.__cause__, seen + 1
    return False


def printable(text: str) -> str:
    """``text`` with each character a terminal would act on written as its escape
    (``\\x1b``, ``\\u202e``): stored text is shown, never run."""
    return _CONTROLS.sub(lambda found: repr(found.group())[1:-1], text)


def echo(text: str, err: bool = False) -> None:
    """Print ``text`` with credentials masked and control characters escaped."""
    click.echo(printable(redact(text)), err=err)


def fail(message: str) -> None:
    echo(f"Error: {message}", err=True)
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
    """Print ``data`` as JSON, or ``human()``; credentials in either are masked, and control
    characters escaped (JSON escapes them itself). JSON is masked value by value, so that it
    stays JSON: a value named like a secret reads ``"***"``, whatever its type."""
    if as_json:
        click.echo(json.dumps(_masked_json(json.loads(json.dumps(data, default=str))), indent=2))
    else:
        echo(human())


def _masked_json(value: Any, secret: bool = False) -> Any:
    """A JSON value with its strings masked as text is (:func:`redact`), and the value of each
    key named like a secret ``"***"`` (none stays none)."""
    if secret and value not in (None, ""):
        return MASK
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _masked_json(v, is_secret_name(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked_json(v) for v in value]
    return value


def entry_dict(entry: ParkedTask, masking: Masking = SHOW_ALL) -> dict[str, Any]:
    """The entry's fields as a person may see them: read without the encryption key, the sealed
    ones say "encrypted"; the caller's ``argsrepr``/``kwargsrepr`` stand for the arguments (as
    in Celery's own events), else the sensitive values are masked (by keyword, by position, at
    any depth), in the error and the traceback too."""
    data = {name: getattr(entry, name) for name in entry.__dataclass_fields__}
    if entry.encrypted:
        data.update(dict.fromkeys(SEALED, ENCRYPTED))
        return data
    options, name, args, kwargs = entry.options, entry.task_name, entry.args, entry.kwargs
    argsrepr, kwargsrepr = options.get("argsrepr"), options.get("kwargsrepr")
    data["args"] = argsrepr if isinstance(argsrepr, str) else masking.args(name, args)
    data["kwargs"] = kwargsrepr if isinstance(kwargsrepr, str) else masking.value(kwargs)
    # Linked signatures and headers carry later steps' arguments: masked as the admin does.
    data["options"] = masking.value(options)
    data["exc_message"] = masking.text(entry.exc_message, name, args, kwargs)
    data["traceback"] = masking.text(entry.traceback, name, args, kwargs)
    return data


def status_text(entry: ParkedTask) -> str:
    """``parked``, ``dead (<reason code>)`` (it waits for a person), or ``held`` (parked, for a
    process that can read it)."""
    if entry.dead_reason:
        return f"dead ({dead_code(entry.dead_reason)})"
    return "held" if entry.held else entry.status


def known_breaker(res: Resilience, name: str) -> None:
    if not is_known(res.runtime, name):
        known = listing(res.runtime).names
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
    stream = sys.stderr  # the results keep stdout
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
                if sys.stdout.isatty():
                    click.clear()
                click.echo(f"{when(time.time())} UTC, every {interval:g}s (Ctrl-C to stop)")
            try:
                show()
            except (ResilienceError, redis.RedisError, OperationalError) as exc:
                app = click.get_current_context().obj.app
                click.echo(outage(exc, app), err=True)
            time.sleep(interval)
    except KeyboardInterrupt:
        pass
