"""Commands that watch the app's health: ``metrics`` (serve /metrics and /healthz) and
``check``."""

from __future__ import annotations

import sys
import time
from typing import Any

import click
from celery.bin.base import CeleryCommand

from ..checks import Finding, run_checks
from ..config.every_error import setting_errors
from ..resilience import Resilience
from ..task import resilient_tasks
from .group import resilience
from .output import app_of, emit, fail, json_option, resilience_of


@resilience.command(cls=CeleryCommand)
@click.option("--port", default=9808, show_default=True, help="Port to serve /metrics on.")
@click.option("--addr", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.pass_context
def metrics(ctx: click.Context, port: int, addr: str) -> None:
    """Serve Prometheus metrics (breakers, parked tasks, drains) read from Redis.

    Every scrape reads Redis afresh; while Redis is away the scrape still answers, with
    celery_resilience_up 0. /healthz answers 200 while Redis answers a PING, 503 while it
    does not, whatever the breakers' states: a probe for Kubernetes.

    \b
    Examples:
      celery -A proj resilience metrics
      celery -A proj resilience metrics --addr 0.0.0.0 --port 9808
    """
    from ..metrics import serve

    res = resilience_of(ctx)
    try:
        serve(res, port, addr)
    except OSError as exc:  # the port is taken, the address is not this host's...
        fail(f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}")
    click.echo(
        f"serving celery-resilience metrics on http://{addr}:{port}/metrics"
        f" (health: http://{addr}:{port}/healthz)"
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass


@resilience.command(cls=CeleryCommand)
@json_option
@click.option(
    "--verbose",
    "-v",
    is_flag=True,
    help="Also show news that asks for nothing (a newer release than the tested versions).",
)
@click.pass_context
def check(ctx: click.Context, as_json: bool, verbose: bool) -> None:
    """Look for settings and Redis setups that can lose work; exit 1 on an error.

    Every problem is reported at once: each bad setting (a worker would stop at the first),
    then what the settings, the tasks and Redis say.

    \b
    Examples:
      celery -A proj resilience check
      celery -A proj resilience check --verbose
      celery -A proj resilience check --json | jq '.[] | select(.level == "error")'
    """
    findings = [f for f in all_findings(app_of(ctx)) if verbose or f.level != "info"]
    emit(
        as_json,
        [{"level": f.level, "message": f.message} for f in findings],
        lambda: "\n".join(f"{f.level.upper()}: {f.message}" for f in findings) or "all good",
    )
    if any(f.level == "error" for f in findings):
        sys.exit(1)


def all_findings(app: Any) -> list[Finding]:
    """Every setting error, then the checks run with the bad settings set aside (their
    defaults read instead; Redis not looked at when its URL is what was wrong)."""
    errors, config = setting_errors(app.conf)
    findings = [Finding("error", str(exc)) for exc in errors]
    if config is None:
        return findings
    url_wrong = any(str(exc).startswith("resilience_redis_url") for exc in errors)
    res = Resilience(app, config) if errors else Resilience.for_app(app)
    try:
        found = run_checks(res.runtime, resilient_tasks(app))
    finally:
        if errors:
            res.runtime.close()
    if url_wrong:  # the URL read as memory:// only to go on: not the user's choice
        found = [f for f in found if not f.message.startswith("resilience_redis_url is memory")]
    return findings + found
