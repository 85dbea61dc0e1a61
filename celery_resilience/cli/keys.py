"""``rotate-keys``: re-encode every parked task with the first configured keys."""

from __future__ import annotations

import sys

import click
from celery.bin.base import CeleryCommand

from ..backout.codec import Codec
from ..rekey import DEFAULT_BATCH, rekey
from .group import resilience
from .output import emit, fail, json_option, progress, resilience_of


@resilience.command(name="rotate-keys", cls=CeleryCommand)
@click.option(
    "--batch", default=DEFAULT_BATCH, show_default=True, help="Entries read per round trip."
)
@click.option(
    "--adopt-unsigned",
    is_flag=True,
    help="Sign entries that carry no signature (parked before signing was turned on).",
)
@json_option
@click.pass_context
def rotate_keys(ctx: click.Context, batch: int, adopt_unsigned: bool, as_json: bool) -> None:
    """Sign and encrypt every parked task again with the first key of resilience_signing_key
    and of resilience_encryption_key (any configured key still reads the old ones). Run it
    after putting a new key first; drop the old key once it reports nothing refused.

    \b
    Examples:
      celery -A proj resilience rotate-keys
      celery -A proj resilience rotate-keys --batch 500 --adopt-unsigned
    """
    if batch < 1:
        fail("--batch must be >= 1")
    res = resilience_of(ctx)
    store = res.runtime.backout_store
    codec = Codec.of(res.runtime.config)
    with progress(as_json, "rotating", store.count) as advance:
        report = rekey(store, codec, adopt_unsigned=adopt_unsigned, batch=batch, progress=advance)
    data = {
        "rewritten": report.rewritten,
        "changed_meanwhile": report.changed_meanwhile,
        "refused": report.refused,
    }

    def human() -> str:
        refused = ", ".join(f"{n} {why}" for why, n in sorted(report.refused.items()))
        return (
            f"rewritten {report.rewritten}, changed meanwhile {report.changed_meanwhile}, "
            f"left as they are: {refused or 'none'}"
        )

    emit(as_json, data, human)
    if report.refused:
        sys.exit(1)
