"""The ``resilience`` command group, a sub-command of ``celery`` (``celery.commands``)."""

from __future__ import annotations

from typing import Any

import click
import redis
from celery.bin.base import handle_preload_options
from kombu.exceptions import OperationalError

from ..errors import ResilienceError
from .output import outage


class ResilienceGroup(click.Group):
    """Commands whose Redis, store or broker is unreachable say so in one line, exit code 1,
    instead of a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (ResilienceError, redis.RedisError, OperationalError) as exc:
            click.echo(outage(exc, getattr(ctx.obj, "app", None)), err=True)
            ctx.exit(1)


@click.group(name="resilience", cls=ResilienceGroup)
@click.pass_context
@handle_preload_options
def resilience(ctx: click.Context) -> None:
    """Shared circuit breakers and parked tasks (celery-resilience)."""
