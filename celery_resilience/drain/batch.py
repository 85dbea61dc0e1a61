"""One claimed batch of the drain, in one direction: check each entry, publish the batch, then
settle it in one pass (ack what went out, give back what may go later, mark dead what never
can and fail its task in Celery).

At-least-once: an entry is removed only after its publish returned. An error that belongs to one
entry never stops the entries behind it; a broker outage gives the rest back for later.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..backout.entry import ParkedTask
from ..backout.store import BackoutStore, dead_code, dead_reason, held
from ..events import replay_dispatcher
from ..redact import get_logger
from ..runtime import Runtime
from .dead_task import fail_task
from .preflight import drain_refusal
from .sending import Sender, Sent

logger = get_logger("celery_resilience.drain")

#: When a publish fails, the entries it left are due again this much later (seconds).
PUBLISH_RETRY_DELAY = 5.0


@dataclass
class BatchOutcome:
    """What publishing one claimed batch came to."""

    published: int = 0
    dead: int = 0
    down: bool = False  # the broker looked down: the rest was given back
    #: Entries that died, by ``<breaker>|<dead reason code>`` (metrics).
    dead_reasons: dict[str, int] = field(default_factory=dict)


class BatchPublisher:
    """Publishes claimed entries of the drain, batch by batch."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.store: BackoutStore = runtime.backout_store

    def publish(self, name: str, claimed: list[ParkedTask]) -> BatchOutcome:
        """Publish a claimed batch of breaker ``name``; ack what went out, mark dead what never
        can, give back the rest."""
        now = self.runtime.now()
        ready, dead = self._check(name, claimed, now)
        sent = self._send(ready)
        return self._settle(name, sent, dead, now)

    def _check(
        self, name: str, claimed: list[ParkedTask], now: float
    ) -> tuple[list[ParkedTask], list[tuple[ParkedTask, str]]]:
        """The entries to publish, and those that die with their dead reason."""
        ready: list[ParkedTask] = []
        dead: list[tuple[ParkedTask, str]] = []
        for entry in claimed:
            if held(entry.reason):  # written before held entries left the ready set
                self.store.release(name, [entry.id], math.inf)
                continue
            refusal = drain_refusal(self.runtime, name, entry, now)
            if refusal is None:
                ready.append(entry)
            else:
                dead.append((entry, refusal.dead_reason))
        return ready, dead

    def _send(self, ready: list[ParkedTask]) -> Sent:
        with (
            self.runtime.app.producer_or_acquire() as producer,
            replay_dispatcher(self.runtime.app) as events,
        ):
            sent = Sender(self.runtime, producer).send(ready)
            for entry in sent.published:
                events.replayed(entry)  # after the publish: the entry is on its way now
        return sent

    def _settle(
        self, name: str, sent: Sent, dead: list[tuple[ParkedTask, str]], now: float
    ) -> BatchOutcome:
        """Ack, mark dead (and fail the dead tasks' workflows), give back: the batch's end."""
        for entry, failure in sent.suspects:
            if sent.published or failure.kind == "entry":
                dead.append((entry, dead_reason("unpublishable", str(failure))))
            else:  # refused, alone: the entry can't be told from the broker; again later
                sent.give_back.append(entry)
        self.store.ack(name, [e.id for e in sent.published])
        outcome = BatchOutcome(len(sent.published), len(dead), sent.down)
        for entry, reason in dead:
            if not self.store.mark_dead(entry.id, reason):
                continue  # deleted or purged meanwhile: nobody waits for it here
            counter = f"{name}|{dead_code(reason)}"
            outcome.dead_reasons[counter] = outcome.dead_reasons.get(counter, 0) + 1
            logger.error("Entry %s (%s) is dead: %s", entry.id, entry.task_name, reason)
            fail_task(self.runtime, entry, reason)  # its workflow must not wait for it
        if sent.give_back:
            self.store.release(name, [e.id for e in sent.give_back], now + PUBLISH_RETRY_DELAY)
        return outcome
