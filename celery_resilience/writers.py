"""Writers of an older format still at work, seen in what they wrote: the newest entries of the
store, read as stored (never decoded), against what this process writes.

While versions or settings change across a fleet (a rolling upgrade, signing or encryption
turned on), a process left behind keeps writing the old way: unsigned or clear entries where
this one signs or seals, the previous envelope after the fleet's minimum version was recorded.
``celery resilience check`` says so, with how many of the newest entries show it.
"""

from __future__ import annotations

from .backout.envelope import KEYED_ENVELOPE, envelope_of
from .backout.store import ANY
from .errors import UndecodableEntry
from .fleet import REFRESH, envelope_for
from .runtime import Runtime

#: Newest entries looked at.
NEWEST = 50
#: Entries parked this long ago or less count as written by a process at work now (seconds).
RECENT = 86400.0


def old_writers(runtime: Runtime) -> list[str]:
    """What the newest entries say of processes writing an older format than this one."""
    store = runtime.backout_store
    now = runtime.now()
    recent = [e for e in store.list(ANY, NEWEST) if now - e.parked_at <= RECENT]
    unsigned = clear = previous = 0
    codec = runtime.codec()
    minimum = runtime.fleet.minimum()
    # Entries parked before the switch (and while processes read it again) are in the previous
    # envelope by right: only those parked later say an older process still parks.
    switched = runtime.fleet.recorded_at() if envelope_for(minimum) == KEYED_ENVELOPE else None
    for entry in recent:
        data = store.payload(entry.id)
        if data is None:
            continue
        try:
            envelope = envelope_of(data)
        except UndecodableEntry:
            continue
        unsigned += codec.signer is not None and envelope.signature is None
        clear += codec.cipher is not None and b"sealed" not in envelope.body
        after = switched is not None and entry.parked_at > switched + REFRESH
        previous += after and envelope.version < KEYED_ENVELOPE
    notes = []
    of = f"of the {len(recent)} newest entries parked in the last day"
    if unsigned:
        notes.append(
            f"{unsigned} {of} are unsigned while resilience_signing_key is set here: a process "
            "without the key (or of a version that ignores it) still parks, and drains "
            "quarantine what it parks (dead unsigned)."
        )
    if clear:
        notes.append(
            f"{clear} {of} hold their arguments in clear while resilience_encryption_key is "
            "set here: a process without the key still parks."
        )
    if previous:
        notes.append(
            f"{previous} {of} were parked in the previous version's envelope after the fleet's "
            f"minimum version was recorded as {minimum}: a process of an older version still "
            "parks (celery resilience fleet lists the workers)."
        )
    return notes
