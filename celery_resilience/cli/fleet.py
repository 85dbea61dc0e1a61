"""``fleet``: the fleet's versions, and the recorded minimum that switches formats on."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import click
from celery.bin.base import CeleryCommand

from ..fleet import REPORT_FRESH, THIS_VERSION, envelope_for, version
from ..remote import COMMAND
from ..resilience import Resilience
from .group import resilience
from .output import emit, fail, json_option, resilience_of, table, when


@dataclass
class Answers:
    """What live workers said, over every round of asking: those that answered Celery's
    ``ping`` (``pinged``), and what each said to the version command (``{"error": ...}`` from
    one that does not know it)."""

    pinged: set[str] = field(default_factory=set)
    said: dict[str, dict[str, Any]] = field(default_factory=dict)

    def names(self) -> set[str]:
        return self.pinged | set(self.said)

    def older(self, minimum: str) -> list[str]:
        """Workers below ``minimum``: by their answer, or by answering ping and never the
        version command (a version before this one)."""
        wanted = version(minimum)
        found = []
        for name in sorted(self.names()):
            text = self.said.get(name, {}).get("version")
            if not isinstance(text, str) or version(text) < wanted:
                found.append(f"{name} ({text or 'a version before ' + THIS_VERSION})")
        return found


def ask_workers(res: Resilience, timeout: float, rounds: int) -> Answers:
    """Ask every live worker (``ping`` and the version command, ``timeout`` seconds each), again
    while a round finds a worker the ones before missed, ``rounds`` times at most: a busy solo
    worker may miss one window."""
    control = res.runtime.app.control
    answers = Answers()
    for _ in range(rounds):
        known = answers.names()
        answers.pinged |= set(control.inspect(timeout=timeout).ping() or {})
        for reply in control.broadcast(COMMAND, reply=True, timeout=timeout) or []:
            for name, said in reply.items():
                answers.said[str(name)] = said if isinstance(said, dict) else {"error": repr(said)}
        if known and answers.names() == known:
            break
    return answers


@resilience.command(name="fleet", cls=CeleryCommand)
@click.option(
    "--minimum",
    help="Record this as the version every process of the fleet runs (switches on the formats "
    "it reads). Asks the live workers first, and you.",
)
@click.option(
    "--timeout", default=3.0, show_default=True, help="Seconds each question to workers waits."
)
@click.option(
    "--rounds",
    default=3,
    show_default=True,
    type=click.IntRange(min=1),
    help="Times the workers are asked at most (again while a round finds one more).",
)
@click.option("--yes", is_flag=True, help="Record --minimum without asking.")
@click.option(
    "--force",
    is_flag=True,
    help="Record --minimum although no worker answered (remote control off, or none running).",
)
@json_option
@click.pass_context
def fleet_command(
    ctx: click.Context,
    minimum: str | None,
    timeout: float,
    rounds: int,
    yes: bool,
    force: bool,
    as_json: bool,
) -> None:
    """The versions of the fleet: this one, the recorded minimum, the versions workers reported
    at start and what every live worker answers now (remote control: ping and the version).

    Entries are written in the previous version's format until the recorded minimum says every
    process reads the new one. Record it once no process of an older version is left: upgrade
    the processes that are not workers first (CLI drains from cron, beat, the admin's web
    processes: nobody can ask them), then the workers.

    \b
    Examples:
      celery -A proj resilience fleet
      celery -A proj resilience fleet --minimum 0.4
    """
    res = resilience_of(ctx)
    fleet = res.runtime.fleet
    if minimum is not None:
        try:
            if version(minimum) > version(THIS_VERSION):
                fail(f"--minimum {minimum} is newer than this version ({THIS_VERSION})")
        except ValueError as exc:
            fail(str(exc))
    answers = ask_workers(res, timeout, rounds)
    recorded = fleet.minimum(fresh=True)
    if minimum is not None:
        _record(res, minimum, answers, recorded, yes, force)
        recorded = minimum
    now = res.runtime.now()
    reports = fleet.reports()
    workers = {
        name: answers.said.get(name) or {"error": "answered ping only"}
        for name in sorted(answers.names())
    }
    data = {
        "this_version": THIS_VERSION,
        "minimum": recorded,
        "envelope": envelope_for(recorded),
        "workers": workers,
        "reported": {
            name: {"version": r.version, "at": r.at, "old": now - r.at > REPORT_FRESH}
            for name, r in reports.items()
        },
    }

    def human() -> str:
        lines = [
            f"this version {THIS_VERSION}; recorded minimum {recorded or 'none'}; entries are "
            f"written in envelope {envelope_for(recorded)}"
        ]
        rows = [
            (name, said.get("version") or f"before {THIS_VERSION}", said.get("envelope", "-"))
            for name, said in workers.items()
        ]
        lines.append(table(("worker answering now", "version", "writes envelope"), rows))
        rows = [(name, r.version, when(r.at)) for name, r in sorted(reports.items())]
        lines.append(table(("reported at start", "version", "at (UTC)"), rows))
        return "\n\n".join(lines)

    emit(as_json, data, human)


def _record(
    res: Resilience,
    minimum: str,
    answers: Answers,
    recorded: str | None,
    yes: bool,
    force: bool,
) -> None:
    older = answers.older(minimum)
    if older:
        fail(f"workers run a version below {minimum}: {', '.join(older)}; upgrade them first")
    if not answers.names() and not force:
        fail(
            "no worker answered ping: remote control is off (worker_enable_remote_control) or "
            "no worker runs, so nothing says the fleet is new enough. Once every process runs "
            f"{minimum} or later, add --force"
        )
    lowering = recorded is not None and version(minimum) < version(recorded)
    if not yes and not lowering:
        question = (
            f"Record {minimum} as the version every process runs? {len(answers.names())} "
            "worker(s) answered; processes of an older version that can't be asked (beat, "
            "CLI drains from cron, the admin's web processes) would quarantine entries "
            "written from now on"
        )
        if not sys.stdin.isatty():
            fail(f"this would record {minimum} as the fleet's minimum version; add --yes")
        if not click.confirm(question, default=False, err=True):
            fail("nothing recorded")
    res.runtime.fleet.record_minimum(minimum)
