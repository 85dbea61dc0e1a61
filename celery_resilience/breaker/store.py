"""The narrow protocol every breaker backend implements: a few coarse atomic operations."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from .types import Action, Change, Decision, Family, Kind, Limits, Skip, State

#: Called with (breaker name, version, state, streak, epoch, family) for every change of a
#: breaker's view; ``epoch`` names the incarnation of the breaker's stored state the version
#: counts in, ``family`` a derived breaker's family after the change (``None``: declared).
ChangeListener = Callable[[str, int, State, bool, str, Family | None], None]


class Watch(Protocol):
    """A live feed of view changes (see ``BreakerStore.watch``)."""

    def close(self) -> None: ...


@dataclass(frozen=True)
class FamilyReport:
    """A family of derived breakers as a store's ``family()`` reports it (see ``knowledge.py``)."""

    version: int
    epoch: str
    troubled: int  # members that are not closed without a streak
    names: frozenset[str]  # their names, if ``complete``
    complete: bool


@dataclass(frozen=True)
class Delivery:
    """Task-level questions asked in the same round trip as the breaker's permit.

    ``count``: this delivery of (task id, retries, replays) is a redelivery (the broker flagged
    it): count it, to spot a message redelivered in a loop (past ``max_deliveries``, 0 = no
    limit). A first delivery is never counted, so deliveries = redeliveries counted + 1.
    ``check_done``: has this task id already succeeded, or does another delivery of it hold
    its claim (``deduplicate=True``)? With ``claim`` (a token unique to this delivery), a
    delivery that is admitted claims the task id in the same step, for ``lease_us``
    microseconds: no other delivery of the id is admitted until the claim is replaced by the
    success marker (``mark_done``), given back (``unclaim``) or its lease ends.
    """

    task_id: str
    retries: int
    replays: int = 0
    count: bool = False
    check_done: bool = False
    ttl: int = 3600
    max_deliveries: int = 0
    claim: str = ""
    lease_us: int = 0

    def skip(self, deliveries: int, done: bool, claimed: bool = False) -> Skip:
        """Why this delivery takes no permit (the spec the stores follow), ``""`` if none."""
        if done:
            return "done"
        # Before "claimed": a message that kills its worker each time claims the id each time,
        # and must still be parked after max_deliveries rather than wait for its claim forever.
        if self.max_deliveries and deliveries > self.max_deliveries:
            return "redelivered"
        if claimed:
            return "claimed"
        return ""

    @property
    def claims(self) -> bool:
        """An admitted delivery claims its task id."""
        return self.check_done and bool(self.claim)


class DeliveryGuard(Protocol):
    """The task-level questions of a delivery: how often was it delivered, did it succeed?

    Asked in the breaker's round trip when the task has a breaker (``BreakerStore.acquire``
    takes the ``Delivery``), alone when it has none. ``scope`` is the breaker's name (its keys
    then share the breaker's hash tag) or ``None``.
    """

    def deliver(self, scope: str | None, delivery: Delivery) -> tuple[int, Skip, int]:
        """``Delivery`` alone, for a task without a breaker: (deliveries, skip, µs until the
        claim another delivery holds ends: with skip ``claimed``, else 0). With skip ``""``
        the delivery claimed the task id if it asked to."""
        ...

    def mark_done(self, scope: str | None, task_id: str, ttl: int) -> None:
        """Remember that ``task_id`` succeeded, for ``ttl`` seconds (it replaces a claim)."""
        ...

    def unclaim(self, scope: str | None, task_id: str, claim: str) -> bool:
        """Give back the claim ``claim`` on ``task_id`` (the delivery did not succeed), if it
        is still held under that token: True if it was."""
        ...


class BreakerStore(Protocol):
    """Atomic operations on named breakers; ``now_us`` pins the time (tests only)."""

    def acquire(
        self,
        name: str,
        limits: Limits,
        permit_id: str,
        deferred_successes: int = 0,
        now_us: int | None = None,
        delivery: Delivery | None = None,
    ) -> Decision: ...

    def record(
        self,
        name: str,
        limits: Limits,
        kind: Kind,
        permit_id: str,
        success: bool,
        deferred_successes: int = 0,
        now_us: int | None = None,
    ) -> Change: ...

    def release(
        self,
        name: str,
        limits: Limits,
        kind: Kind,
        permit_id: str,
        deferred_successes: int = 0,
        now_us: int | None = None,
    ) -> Change:
        """Give a permit back without an outcome (a probe's slot is freed)."""
        ...

    def force(
        self, name: str, limits: Limits, action: Action, now_us: int | None = None
    ) -> Change: ...

    def snapshot(
        self, name: str, limits: Limits, now_us: int | None = None
    ) -> dict[str, object]: ...

    def watch(
        self, on_change: ChangeListener, on_live: Callable[[], None], on_lost: Callable[[], None]
    ) -> Watch:
        """Feed every view change of every breaker to ``on_change``, from now on.

        ``on_live`` is called once no change can be missed any more (a subscription confirmed),
        ``on_lost`` when some may have been (the feed's connection dropped): until the next
        ``on_live``, what a process heard is not to be trusted.
        """
        ...
