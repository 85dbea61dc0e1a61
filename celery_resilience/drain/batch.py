"""One claimed batch of the drain, in one direction: check each entry, publish what its queue
has room for, then settle the batch (ack what went out, mark dead what never can and fail its
task in Celery) and give back the rest, all at the batch's end.

At-least-once: an entry is removed only after its publish returned. An error that belongs to one
entry never stops the entries behind it; a broker outage gives the rest back for later. Every
entry claimed and not replayed goes back to the store through one function,
:meth:`BatchPublisher.give_back`: one on-demand-only entry, one held for another process, one
its queue has no room for, one a publish failed or an outage stopped, or every unsent entry of
a batch an error interrupted.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

from ..backout.entry import ParkedTask
from ..backout.lifetime import REPLAYED, Consumed, replayed_copy
from ..backout.store import NO_BREAKER, BackoutStore, dead_code, dead_reason, on_demand_only
from ..backout.trust import UNKNOWN_KEY
from ..breaker.types import BUCKETS
from ..events import ReplayEvents, replay_dispatcher
from ..redact import get_logger
from ..runtime import Runtime
from .dead_task import fail_task
from .preflight import drain_refusal
from .queue_room import QueueRoom
from .sending import Sender, Sent

logger = get_logger("celery_resilience.drain")

#: When a publish fails, the entries it left are due again this much later (seconds).
PUBLISH_RETRY_DELAY = 5.0
#: An entry this process holds (a key it lacks, a newer format) is due again this much later,
#: for a process that can read it (seconds).
HOLD_DELAY = 30.0


@dataclass(frozen=True)
class Back:
    """An entry a batch gives back: due again at ``due_at``; ``held``: the code of why this
    process can't read it (left for one that can), ``None`` for an entry simply due again."""

    entry: ParkedTask
    due_at: float
    held: str | None = None


@dataclass
class BatchOutcome:
    """What publishing one claimed batch came to."""

    published: int = 0
    dead: int = 0
    down: bool = False  # the broker looked down: the rest was given back
    held: int = 0  # left parked for a process that can read them
    over_budget: bool = False  # the breaker's retry budget refused some: none left this window
    #: Entries that died, by ``<breaker>|<dead reason code>`` (metrics).
    dead_reasons: dict[str, int] = field(default_factory=dict)


class BatchPublisher:
    """Publishes claimed entries of the drain, batch by batch. Within :meth:`announcing` (a
    drain's run), one event dispatcher serves every batch."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.store: BackoutStore = runtime.backout_store
        self._run: ExitStack | None = None
        self._events: ReplayEvents | None = None

    @contextmanager
    def announcing(self) -> Iterator[None]:
        """One ``task-replayed`` dispatcher (and its broker connection) for the batches of a
        run, opened by its first batch and flushed after each, instead of one per batch."""
        with ExitStack() as run:
            self._run = run
            try:
                yield
            finally:
                self._run = self._events = None

    def publish(
        self,
        name: str,
        claimed: list[ParkedTask],
        room: QueueRoom | None = None,
        now: float | None = None,
    ) -> BatchOutcome:
        """Publish a claimed batch of breaker ``name`` (what ``room`` lets go: all without
        one); ack what went out, mark dead what never can, give back the rest. ``now``: Redis
        time as the batch was claimed (read here without it)."""
        now = self.runtime.now() if now is None else now
        back: list[Back] = []
        sent: Sent | None = None
        try:
            ready, dead = self._check(name, claimed, now, back)
            if room is not None:
                ready, wait = room.fit(ready)
                back += [Back(e, now) for e in wait]  # their queue is full: for the next pass
            ready, over = self._in_budget(name, ready, now)
            back += over
            sent = self._send(ready)
            outcome = self._settle(name, sent, dead, now, back)
        except BaseException:
            if sent is None:  # nothing went out: all of it is due again at once
                given = {b.entry.id for b in back}
                back += [Back(e, now) for e in claimed if e.id not in given]
            self._give_back_after_error(name, back)
            raise
        self.give_back(name, back)
        outcome.held = sum(1 for b in back if b.held is not None)
        outcome.over_budget = bool(over)
        return outcome

    def give_back(self, name: str, back: list[Back]) -> None:
        """Return to the store every entry of a batch that was claimed and not replayed: due
        again at its ``due_at`` (one store call per due time), or held for a process that can
        read it."""
        groups: dict[tuple[float, str | None], list[str]] = {}
        for item in back:
            groups.setdefault((item.due_at, item.held), []).append(item.entry.id)
        for (due_at, code), ids in groups.items():
            if code is None:
                self.store.give_back(name, ids, due_at)
            else:
                self.store.hold(name, ids, code, due_at)

    def _give_back_after_error(self, name: str, back: list[Back]) -> None:
        try:
            self.give_back(name, back)
        except Exception as exc:  # the claims' lease ends anyway: they come due again then
            logger.warning("Could not give back %d entries after an error: %s", len(back), exc)

    def _check(
        self, name: str, claimed: list[ParkedTask], now: float, back: list[Back]
    ) -> tuple[list[ParkedTask], list[tuple[ParkedTask, str]]]:
        """The entries to publish and those that die with their dead reason; those to give back
        (on demand only, held for another process) join ``back``."""
        ready: list[ParkedTask] = []
        dead: list[tuple[ParkedTask, str]] = []
        consumed = self.store.consumed([e.id for e in claimed])
        for entry in claimed:
            if on_demand_only(entry.reason):  # parked before such entries left the ready set
                back.append(Back(entry, math.inf))
                continue
            if replayed_copy(entry, consumed):  # published before: its task ran then
                dead.append((entry, REPLAYED))
                continue
            refusal = drain_refusal(self.runtime, name, entry, now)
            if refusal is None:
                ready.append(entry)
            elif refusal.held:  # for a process that can read it
                logger.info("Entry %s left parked: %s", entry.id, entry.held)
                back.append(Back(entry, now + HOLD_DELAY, entry.held_code or UNKNOWN_KEY))
            else:
                dead.append((entry, refusal.dead_reason))
        return ready, dead

    def _in_budget(
        self, name: str, ready: list[ParkedTask], now: float
    ) -> tuple[list[ParkedTask], list[Back]]:
        """The entries the breaker's retry budget lets through (replays spend it as retries do),
        and the rest to give back, due when a bucket of the budget's window has passed."""
        if name == NO_BREAKER or not ready:
            return ready, []
        breaker = self.runtime.breaker(name)
        granted = breaker.spend_retries(len(ready))
        later = now + breaker.config.window / BUCKETS
        return ready[:granted], [Back(e, later) for e in ready[granted:]]

    def _send(self, ready: list[ParkedTask]) -> Sent:
        if self._run is None:  # a batch outside a run: a dispatcher of its own
            with replay_dispatcher(self.runtime.app) as events:
                return self._send_with(ready, events)
        if self._events is None:
            self._events = self._run.enter_context(replay_dispatcher(self.runtime.app))
        sent = self._send_with(ready, self._events)
        self._events.flush()
        return sent

    def _send_with(self, ready: list[ParkedTask], events: ReplayEvents) -> Sent:
        with self.runtime.app.producer_or_acquire() as producer:
            sent = Sender(self.runtime, producer).send(ready)
        for entry in sent.published:
            events.replayed(entry)  # after the publish: the entry is on its way now
        return sent

    def _settle(
        self,
        name: str,
        sent: Sent,
        dead: list[tuple[ParkedTask, str]],
        now: float,
        back: list[Back],
    ) -> BatchOutcome:
        """Ack, mark dead (and fail the dead tasks' workflows): the batch's end. What was not
        published and need not die joins ``back``."""
        for entry, failure in sent.suspects:
            if sent.published or failure.kind == "entry":
                dead.append((entry, dead_reason("unpublishable", str(failure))))
            else:  # refused, alone: the entry can't be told from the broker; again later
                sent.give_back.append(entry)
        back += [Back(e, now + PUBLISH_RETRY_DELAY) for e in sent.give_back]
        lifetime = self.runtime.config.entry_lifetime
        remembered = [Consumed.of(e, now, lifetime) for e in sent.published]
        self.store.ack(name, [e.id for e in sent.published], remembered)
        outcome = BatchOutcome(len(sent.published), len(dead), sent.down)
        for entry, reason in dead:
            if not self.store.mark_dead(entry.id, reason):
                continue  # deleted or purged meanwhile: nobody waits for it here
            counter = f"{name}|{dead_code(reason)}"
            outcome.dead_reasons[counter] = outcome.dead_reasons.get(counter, 0) + 1
            logger.error("Entry %s (%s) is dead: %s", entry.id, entry.task_name, reason)
            if reason != REPLAYED:  # a copy: its task ran when the entry was first published
                fail_task(self.runtime, entry, reason)  # its workflow must not wait for it
        return outcome
