"""Repair: dead entries re-checked with this process's codec and keys, and parked again when
they read and verify now.

An entry quarantined by a process that could not read it (``undecodable``: a format it did not
know; ``unsigned``, ``tampered``, ``undecryptable``: keys it did not hold) may be perfectly good
for this one. Each is read again here; one that decodes, verifies and opens is signed again
(in the envelope the fleet reads, with this process's first keys) and parked again, due now;
one that does not stays dead, with the reason this process gives.

Signed again, it gets a fresh lifetime (``lifetime.renewed``): it waited dead, not forgotten.
An entry whose lifetime ended meanwhile stays dead unless a person vouches for it
(``past_lifetime``): past it, the drain's memory of what it consumed is gone, so a copy of an
entry already run, marked dead by someone with write access, would look the same. One the
memory names as such a copy stays dead whatever is said.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

from .backout.codec import Codec
from .backout.entry import HELD_TASK, UNDECODABLE_TASK, UNVERIFIED_TASK, ParkedTask
from .backout.lifetime import renewed, replayed_copy
from .backout.store import BackoutStore, breaker_key, dead_code
from .backout.trust import TAMPERED, UNDECRYPTABLE, UNSIGNED
from .backout.walk import pages

#: Dead reasons that say the bytes could not be read or trusted where they died.
REPAIRABLE = ("undecodable", UNSIGNED, TAMPERED, UNDECRYPTABLE)
#: Entries read per page while looking for repairable ones.
PAGE = 500


@dataclass
class RepairReport:
    """Entries parked again, and those left dead with this process's reason."""

    revived: list[ParkedTask] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)


def unreadable_here(entry: ParkedTask) -> str | None:
    """Why this process can't use ``entry`` as read (a placeholder, or sealed from it); ``None``
    when it read and verified the entry whole."""
    if entry.held:
        return f"held: {entry.held}"
    if entry.task_name in (UNDECODABLE_TASK, UNVERIFIED_TASK, HELD_TASK) or entry.encrypted:
        return entry.exc_message or f"entry {entry.id} can't be read here"
    return None


def repairable(store: BackoutStore, breaker: str | None = None) -> list[ParkedTask]:
    """The dead entries whose dead reason says they could not be read or trusted where they
    died (read here, so each says what this process makes of it), found by a walk that entries
    coming and going never make skip one."""
    found: list[ParkedTask] = []
    for page in pages(store, PAGE):
        for entry in store.entries([i for i, _ in page]):
            if entry.status != "dead" or dead_code(entry.dead_reason) not in REPAIRABLE:
                continue
            if breaker is None or breaker_key(entry.breaker) == breaker:
                found.append(entry)
    return found


def refusal(
    entry: ParkedTask, now: float, consumed: dict[str, float], past_lifetime: bool = False
) -> str | None:
    """Why ``entry`` stays dead here (``None``: it may be parked again)."""
    why = unreadable_here(entry)
    if why is not None:
        return why
    if replayed_copy(entry, consumed):
        return "a copy of an entry already published (the drain remembers it)"
    if entry.expires_at is not None and entry.expires_at <= now and not past_lifetime:
        when = datetime.fromtimestamp(entry.expires_at, tz=timezone.utc).isoformat()
        return (
            f"its signed lifetime ended at {when}: it can no longer be told from a copy of one "
            "already run (repair --past-lifetime if you vouch for it, or replay it by hand)"
        )
    return None


def repair(
    store: BackoutStore,
    codec: Codec,
    entries: list[ParkedTask],
    now: float,
    *,
    past_lifetime: bool = False,
    progress: Callable[[int], None] | None = None,
) -> RepairReport:
    """Sign again and park again, due ``now`` (Redis's time), each of ``entries`` that reads and
    verifies here (see the module's docstring for ``past_lifetime``)."""
    report = RepairReport()
    consumed = store.consumed([e.id for e in entries])
    for entry in entries:
        why = refusal(entry, now, consumed, past_lifetime)
        if why is None and not _resign(store, codec, entry, now, consumed, past_lifetime):
            why = "its bytes changed meanwhile"
        if why is None and not store.revive(entry.id, entry.dead_reason or "", now):
            why = "no longer dead for that reason (changed meanwhile)"
        if why is None:
            report.revived.append(entry)
        else:
            report.refused[entry.id] = why
        if progress is not None:
            progress(1)
    return report


def _resign(
    store: BackoutStore,
    codec: Codec,
    entry: ParkedTask,
    now: float,
    consumed: dict[str, float],
    vouched: bool,
) -> bool:
    """Write ``entry`` again with this codec, its lifetime renewed (a compare-and-set)."""
    data = store.payload(entry.id)
    if data is None:
        return False
    if codec.lifetime is not None:
        entry = entry.replace(
            expires_at=renewed(entry, now, codec.lifetime, consumed, vouched=vouched)
        )
    return store.rewrite(
        entry.id, data, codec.reencode(entry.replace(status="parked", dead_reason=None))
    )
