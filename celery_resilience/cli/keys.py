"""The store's keys and formats: ``rotate-keys`` (every entry re-signed and re-sealed, unsigned
ones adopted when a person vouches for them) and ``repair`` (dead entries re-checked here)."""

from __future__ import annotations

import sys
from datetime import datetime, timezone

import click
from celery.bin.base import CeleryCommand

from ..adopt import PICKLED, Candidate, adopt, candidates
from ..known_tasks import masking_of
from ..rekey import DEFAULT_BATCH, rekey
from ..repair import refusal, repairable
from ..repair import repair as repair_entries
from ..resilience import Resilience
from .group import resilience
from .output import (
    breaker_filter,
    echo,
    emit,
    fail,
    json_option,
    progress,
    resilience_of,
)

#: Entries an adoption lists before it asks (the rest are counted).
SHOWN = 20


def _moment(text: str) -> float:
    """An ISO time (UTC unless it says otherwise) as epoch seconds."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        fail(f"--parked-before must be an ISO time such as 2025-03-14T12:00, got {text!r}")
        raise  # unreachable: fail exits
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


@resilience.command(name="rotate-keys", cls=CeleryCommand)
@click.option(
    "--batch", default=DEFAULT_BATCH, show_default=True, help="Entries read per round trip."
)
@click.option(
    "--adopt-unsigned",
    is_flag=True,
    help="Sign, as they are, unsigned entries parked before --parked-before (you vouch for "
    "them: parked before signing was turned on). Lists them and asks first.",
)
@click.option("--parked-before", help="With --adopt-unsigned: an ISO time (UTC by default).")
@click.option("--breaker", help="With --adopt-unsigned: only entries of this breaker.")
@click.option("--yes", is_flag=True, help="Adopt without asking.")
@json_option
@click.pass_context
def rotate_keys(
    ctx: click.Context,
    batch: int,
    adopt_unsigned: bool,
    parked_before: str | None,
    breaker: str | None,
    yes: bool,
    as_json: bool,
) -> None:
    """Sign and encrypt every parked task again with the first key of resilience_signing_key
    and of resilience_encryption_key (any configured key still reads the old ones). It walks
    every entry, whatever drains do meanwhile, and exits 1 if it left any as it was. Run it
    after putting a new key first everywhere; drop the old key once it reports nothing left.

    With --adopt-unsigned it signs only the unsigned entries a person picks (--parked-before,
    --breaker), never decoding a pickled one: it lists them and asks first (--yes not to).

    \b
    Examples:
      celery -A proj resilience rotate-keys
      celery -A proj resilience rotate-keys --adopt-unsigned --parked-before 2025-03-01T00:00
    """
    if batch < 1:
        fail("--batch must be >= 1")
    res = resilience_of(ctx)
    store = res.runtime.backout_store
    codec = res.runtime.codec()
    if adopt_unsigned:
        if parked_before is None:
            fail("--adopt-unsigned needs --parked-before: the time before which you vouch for them")
        if codec.signer is None:
            fail("--adopt-unsigned needs resilience_signing_key: there is no key to sign with")
        breaker_filter(res, breaker)
        _adopt(res, list(candidates(store, _moment(parked_before or ""), breaker)), yes, as_json)
        return
    if parked_before is not None or breaker is not None:
        fail("--parked-before and --breaker go with --adopt-unsigned")
    with progress(as_json, "rotating", store.count) as advance:
        report = rekey(store, codec, now=res.runtime.now(), batch=batch, progress=advance)
    data = {
        "rewritten": report.rewritten,
        "gone_meanwhile": report.gone,
        "refused": report.refused,
        "not_rewritten": report.failed,
    }

    def human() -> str:
        refused = ", ".join(f"{n} {why}" for why, n in sorted(report.refused.items()))
        lines = [
            f"rewritten {report.rewritten}, drained or deleted meanwhile {report.gone}, "
            f"left as they are: {refused or 'none'}"
        ]
        if report.failed:
            lines.append(f"not rewritten (changed under the rotation): {', '.join(report.failed)}")
        if not report.done:
            lines.append("not done: run it again once the entries left are dealt with")
        return "\n".join(lines)

    emit(as_json, data, human)
    if not report.done:
        sys.exit(1)


def _adopt(res: Resilience, chosen: list[Candidate], yes: bool, as_json: bool) -> None:
    runtime = res.runtime
    store = runtime.backout_store
    if not chosen:
        emit(
            as_json,
            {"signed": 0, "revived": 0, "changed": [], "refused": []},
            lambda: "no unsigned entry to adopt",
        )
        return
    refused = [c for c in chosen if c.refused]
    if not yes and len(refused) < len(chosen):
        masking = masking_of(runtime)
        for candidate in chosen[:SHOWN]:
            echo(candidate.summary(masking), err=True)
        if len(chosen) > SHOWN:
            click.echo(f"... and {len(chosen) - SHOWN} more", err=True)
        count = len(chosen) - len(refused)
        question = (
            f"Sign these {count} unsigned entries as they are? Signed, a drain publishes "
            "them: sign only what this store's writers parked before signing was on (the time "
            "they were picked by is not signed: it proves nothing)"
        )
        if not sys.stdin.isatty():
            fail(f"this would sign {count} unsigned entries; add --yes to do it")
        if not click.confirm(question, default=False, err=True):
            fail("nothing adopted")
    now = runtime.now()
    report = adopt(store, runtime.codec(), chosen, lambda i: store.revive(i, "unsigned", now))
    data = {
        "signed": report.signed,
        "revived": report.revived,
        "changed": report.changed,
        "refused": report.refused,
    }

    def human() -> str:
        lines = [
            f"signed {report.signed} (parked again {report.revived} a drain had quarantined), "
            f"changed meanwhile and left unsigned: {len(report.changed)}"
        ]
        if report.refused:
            lines.append(f"refused, left unsigned: {len(report.refused)} ({PICKLED})")
        return "\n".join(lines)

    emit(as_json, data, human)
    if report.changed or report.refused:
        sys.exit(1)


@resilience.command(cls=CeleryCommand)
@click.option("--breaker", help="Only dead entries of this breaker ('-' for none).")
@click.option(
    "--past-lifetime",
    is_flag=True,
    help="Also park again entries whose signed lifetime ended (you vouch for them: past it, a "
    "copy of an entry already run can't be told from it).",
)
@click.option("--dry-run", is_flag=True, help="Say what would be parked again; change nothing.")
@json_option
@click.pass_context
def repair(
    ctx: click.Context, breaker: str | None, past_lifetime: bool, dry_run: bool, as_json: bool
) -> None:
    """Re-check dead undecodable, unsigned, tampered and undecryptable entries with this
    process's settings and keys, and sign again and park again (due now) those that read and
    verify here, with a fresh lifetime: a process with other keys or an older release may have
    quarantined good entries. The others stay dead, with the reason this process gives, as do
    entries whose lifetime ended (unless --past-lifetime). Exits 1 if any stays dead.

    \b
    Examples:
      celery -A proj resilience repair --dry-run
      celery -A proj resilience repair --breaker payments
    """
    res = resilience_of(ctx)
    breaker_filter(res, breaker)
    store = res.runtime.backout_store
    name = None if breaker is None else ("-" if breaker in ("", "-", "none") else breaker)
    entries = repairable(store, name)
    now = res.runtime.now()
    if dry_run:
        consumed = store.consumed([e.id for e in entries])
        why = {e.id: refusal(e, now, consumed, past_lifetime) for e in entries}
        would = [i for i, w in why.items() if w is None]
        refused = {i: w for i, w in why.items() if w is not None}
        emit(
            as_json,
            {"would_revive": would, "refused": refused},
            lambda: "\n".join(
                [f"would park again {i}" for i in would]
                + [f"stays dead {i}: {w}" for i, w in refused.items()]
                + [f"{len(would)} would be parked again, {len(refused)} stay dead (dry run)"]
            ),
        )
        return
    with progress(as_json, "repairing", lambda: len(entries)) as advance:
        report = repair_entries(
            store, res.runtime.codec(), entries, now, past_lifetime=past_lifetime, progress=advance
        )
    revived = [{"id": e.id, "task": e.task_name, "task_id": e.task_id} for e in report.revived]
    emit(
        as_json,
        {"revived": revived, "refused": report.refused},
        lambda: "\n".join(
            [f"parked again {r['id']} -> {r['task']}[{r['task_id']}]" for r in revived]
            + [f"stays dead {i}: {why}" for i, why in report.refused.items()]
            + [f"{len(revived)} parked again, {len(report.refused)} stay dead"]
        ),
    )
    if report.refused:
        sys.exit(1)
