"""A replay on demand: one entry published now, whatever its breaker says (a person asked).

It takes the drain's lock, so that a drain and a person never send one entry twice.

An entry found to be a copy of one already published is marked dead ``replayed`` and refused,
as a drain does. Once dead ``replayed``, a person may still send it (never a drain): the
memory that judged it may be wrong (a clock that went back, the database store's host
clocks), and a person may know its task did not run. It is sent with a warning: its task may
run twice.
"""

from __future__ import annotations

from ..backout.entry import ParkedTask
from ..backout.lifetime import REPLAYED, Consumed, replayed_copy
from ..backout.store import breaker_key, counter_scope, dead_code
from ..backout.trust import TAMPERED, UNSIGNED
from ..errors import DrainBusy, EntryNotFound, NotReplayable
from ..events import replay_dispatcher
from ..redact import get_logger
from ..runtime import Runtime
from .dead_task import fail_task
from .lock import drain_lock
from .message import publish
from .preflight import preflight

#: Seconds a replay on demand holds the drain lock at most.
REPLAY_LEASE = 60.0
#: Seconds a replay on demand waits for a drain to give the lock up.
REPLAY_WAIT = 10.0

logger = get_logger("celery_resilience.drain")


def replay(runtime: Runtime, entry_id: str) -> ParkedTask:
    """Publish one entry now, whatever its breaker says (a person asked), then remove it.

    :class:`EntryNotFound` (a ``KeyError``) if absent; :class:`NotReplayable` (a ``ValueError``)
    saying why if a worker would refuse it (an expired entry is marked dead on the way, as the
    drain would); :class:`DrainBusy` (a ``TimeoutError``) if a drain kept the lock for
    :data:`REPLAY_WAIT`.
    A dead entry is sent if its cause is gone (its arguments fitting, not expired): its
    workflow, failed when it died, is not revived.
    """
    store = runtime.backout_store
    with drain_lock(runtime, REPLAY_LEASE, wait=REPLAY_WAIT) as lock:
        if lock is None:
            raise DrainBusy("a drain holds the lock; try again in a moment")
        # What the ack writes: a user that may not write it is refused before the publish.
        store.forget_consumed()
        entry = store.get(entry_id)
        if entry is None:
            raise EntryNotFound(entry_id)
        now = runtime.now()
        copy = marked_copy(entry)
        if not copy and replayed_copy(entry, store.consumed([entry_id])):
            store.mark_dead(entry_id, REPLAYED)
            raise NotReplayable(
                f"entry {entry_id} is a copy of one already published (now dead: {REPLAYED}); "
                "replay it again only if you know its task did not run: it may run twice"
            )
        refusal = preflight(runtime, entry, now, by_hand=True)
        if refusal is not None:
            if refusal.held:  # another process may send it: left as it is
                raise NotReplayable(f"entry {entry_id} is {refusal.message}")
            if refusal.dead_reason == "expired" and store.mark_dead(entry_id, "expired"):
                fail_task(runtime, entry, refusal.dead_reason)
            elif dead_code(refusal.dead_reason) in (TAMPERED, UNSIGNED):
                store.mark_dead(entry_id, refusal.dead_reason)  # quarantined, as a drain does
            raise NotReplayable(refusal.message)
        publish(runtime, entry)
        with replay_dispatcher(runtime.app) as events:
            events.replayed(entry)
        name = breaker_key(entry.breaker)
        store.ack(name, [entry_id], [Consumed.of(entry, now, runtime.config.entry_lifetime)])
        scope = counter_scope(name, runtime.config.family_of)
        store.bump({f"replayed|{scope}": 1})
    logger.warning("Replayed %s[%s] (entry %s)", entry.task_name, entry.task_id, entry_id)
    if copy:
        logger.warning("%s: %s", entry_id, COPY_WARNING)
    return entry


#: What a person hears when a copy marked ``replayed`` is sent by hand.
COPY_WARNING = (
    "it was marked a copy of an entry already published (dead replayed): if that one ran, its "
    "task runs twice"
)


def marked_copy(entry: ParkedTask) -> bool:
    """Whether ``entry`` is dead as a copy of an entry already published."""
    return entry.status == "dead" and dead_code(entry.dead_reason) == REPLAYED
