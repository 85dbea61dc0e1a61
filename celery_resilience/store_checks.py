"""What ``check`` says of the back-out store's trust across a fleet: settings that weaken it
(pickle, a lifetime shorter than entries wait), and what the store shows of processes that
read or write it differently (entries held for another process, copies marked ``replayed``
that the previous release would replay by hand, writers of an older format).

Each note is a warning: nothing is lost, a guarantee is weakened or a person must act.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .backoff import max_delay
from .backout.lifetime import REPLAYED
from .backout.trust import NEWER_FORMAT, UNKNOWN_KEY
from .config.trust import PICKLE
from .errors import StoreUnavailable
from .fleet import KEYED_FROM, THIS_VERSION, version
from .runtime import Runtime
from .writers import old_writers

#: What each held reason asks of a person.
HELD_HELP = {
    UNKNOWN_KEY: "signed or sealed with a key the processes that drained them lack: give "
    "the drainers that key (second in resilience_signing_key or resilience_encryption_key)",
    NEWER_FORMAT: "written by a newer release: let the drain run on processes of that release",
}


def settings_notes(runtime: Runtime, tasks: Iterable[Any]) -> list[str]:
    """Settings that weaken the store's guarantees (no Redis read)."""
    config = runtime.config
    notes = []
    if config.serializer == PICKLE:
        notes.append(
            "resilience_serializer is 'pickle': every process that reads the back-out store "
            "(drainer, CLI, Django admin) unpickles what it holds, so the signing key is as "
            "powerful as code execution in them (signing verifies an entry before it is "
            "unpickled). Prefer 'json' or 'msgpack'."
        )
    waits = {
        "resilience_max_countdown": config.max_countdown,
        "resilience_park_on_delay": config.park_on_delay,
    }
    for task in tasks:
        longest = max_delay(task.backoff)
        if longest is not None:
            waits[f"{task.name}'s backoff"] = longest
    what, longest = max(waits.items(), key=lambda item: item[1])
    if longest >= config.entry_lifetime:
        notes.append(
            f"entries may wait {longest:.0f}s ({what}), not less than resilience_entry_lifetime "
            f"({config.entry_lifetime:.0f}s): a lifetime starts when an entry is due, and one "
            "that a breaker holds back or a drainer can't read for longer dies stale (a person "
            "may still replay it). Set resilience_entry_lifetime well above the longest wait."
        )
    return notes


def store_notes(runtime: Runtime) -> list[str]:
    """What the store shows of the fleet (``RedisError`` when Redis can't be reached); a store
    that can't be read here (another store, a Redis user refused) says so."""
    try:
        return _held(runtime) + _replayed(runtime) + old_writers(runtime)
    except StoreUnavailable as exc:
        return [f"the back-out store could not be read for the checks of its entries: {exc}"]


def _held(runtime: Runtime) -> list[str]:
    held = runtime.backout_store.held_entries()
    if not held:
        return []
    now = runtime.now()
    parts = [
        f"{count} {code} (the oldest parked {_age(now - oldest)} ago; {HELD_HELP.get(code, '')})"
        for code, (count, oldest) in sorted(held.items())
    ]
    total = sum(count for count, _ in held.values())
    return [
        f"drains leave {total} entries parked, held for a process that can read them: "
        f"{'; '.join(parts)}. Nothing publishes them until one can (celery resilience list "
        "says each one's reason)."
    ]


def _replayed(runtime: Runtime) -> list[str]:
    """Copies marked ``replayed``, while a process of the previous release (which does not know
    that reason) may still run: a replay by hand of dead entries there publishes them."""
    minimum = runtime.fleet.minimum()
    try:
        recorded = minimum is not None and version(minimum) >= version(KEYED_FROM)
    except ValueError:  # a minimum written by hand that is not a version
        recorded = False
    if recorded:
        return []
    copies = runtime.backout_store.dead_by_reason().get(REPLAYED, 0)
    if not copies:
        return []
    return [
        f"{copies} dead entries are copies of entries already published (dead {REPLAYED}), "
        "and the fleet's minimum version is not recorded: a process of the previous release "
        "does not know that reason, and a replay of dead entries by hand there (replay --all "
        "--status dead) would run those tasks again. Replay dead entries from this release "
        "only, discard the copies (celery resilience list --status dead shows them), and "
        f"record the minimum once every process runs {THIS_VERSION} (celery resilience fleet "
        f"--minimum {THIS_VERSION})."
    ]


def _age(seconds: float) -> str:
    if seconds < 3600:
        return f"{max(0.0, seconds) / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
