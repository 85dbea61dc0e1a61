"""The ``resilience`` command group, a sub-command of ``celery`` (``celery.commands``)."""

from __future__ import annotations

import click
from celery.bin.base import handle_preload_options


@click.group(name="resilience")
@click.pass_context
@handle_preload_options  # type: ignore[untyped-decorator]
def resilience(ctx: click.Context) -> None:
    """Shared circuit breakers and parked tasks (celery-resilience)."""
