"""One claimed batch of the drain: judge each entry, publish, then ack, mark dead or give back.

At-least-once: an entry is removed only after its publish returned. An error that belongs to one
entry never stops the entries behind it; a broker outage gives the rest back for later.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .events import replay_dispatcher
from .headers import rejected_replays
from .parked.entry import ParkedTask
from .parked.store import BackoutStore, breaker_key, dead_code, dead_reason, held
from .parked.trust import TAMPERED
from .redact import get_logger
from .replay import Refusal, fail_task, preflight
from .runtime import Runtime
from .sending import Sender

logger = get_logger("celery_resilience.drain")

#: Replays (counting those the breaker turned away) after which an entry is dead regardless.
REJECTED_REPLAYS_FACTOR = 10
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
        self.config = runtime.config

    def publish(self, name: str, claimed: list[ParkedTask]) -> BatchOutcome:
        """Publish a claimed batch of breaker ``name``; ack what went out, mark dead what never
        can, give back the rest."""
        now = self.runtime.now()
        ready: list[ParkedTask] = []
        dead: list[tuple[ParkedTask, str]] = []
        for entry in claimed:
            if held(entry.reason):  # written before held entries left the ready set
                self.store.release(name, [entry.id], math.inf)
                continue
            refusal = self.refusal(entry, now)
            if refusal is None and breaker_key(entry.breaker) != name:
                # Its signed payload names another breaker: moved into this ready set beside
                # it, around the gate of its own breaker.
                refusal = Refusal(TAMPERED, f"entry {entry.id} sits under breaker {name!r}")
            if refusal is None:
                ready.append(entry)
            else:
                dead.append((entry, refusal.dead_reason))
        with (
            self.runtime.app.producer_or_acquire() as producer,
            replay_dispatcher(self.runtime.app) as events,
        ):
            sent = Sender(self.runtime, producer).send(ready)
            for entry in sent.published:
                events.replayed(entry)  # after the publish: the entry is on its way now
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

    def refusal(self, entry: ParkedTask, now: float) -> Refusal | None:
        refusal = preflight(self.runtime, entry, now)
        if refusal is not None:
            return refusal
        rejected = rejected_replays(entry.options.get("headers"))
        # Replays the breaker turned away unrun are not attempts; a hard cap still ends a
        # task that is turned away forever.
        if entry.replays - rejected >= self.config.max_replays or (
            entry.replays >= self.config.max_replays * REJECTED_REPLAYS_FACTOR
        ):
            return Refusal(
                "max_replays",
                f"{entry.task_name}[{entry.task_id}] was replayed {entry.replays} times",
            )
        return None
