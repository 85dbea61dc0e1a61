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
class DeliveryQuestions:
    """Task-level questions asked in the same round trip as the breaker's permit.

    ``count``: this delivery of (task id, retries, replays) is a redelivery (the broker flagged
    it): count it, to spot a message redelivered in a loop (past ``max_deliveries``, 0 = no
    limit). A first delivery is never counted, so deliveries = redeliveries counted + 1.
    ``check_done``: has this task id already succeeded, or does another delivery of it hold
    its claim (``deduplicate=True``)? With ``claim`` (a token unique to this delivery), a
    delivery that is admitted claims the task id in the same step, for ``lease_us``
    microseconds: no other delivery of the id is admitted until the claim is replaced by the
    success marker (``mark_done``), given back (``unclaim``) or its lease ends. With ``key``
    (a dedup key from the task's arguments, ``deduplicate="order:{order_id}"``) the claim and
    the success marker are the key's instead of the task id's: deliveries of other task ids
    with the same key are held off, or skipped, as a copy of the id would be.
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
    key: str = ""

    @property
    def marker(self) -> str:
        """What this delivery's dedup marker is named after (see :func:`marker_of`)."""
        return marker_of(self.task_id, self.key)

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


def marker_of(task_id: str, key: str = "") -> str:
    """The name of a dedup marker within its scope: ``done:<task id>``, or ``dedup:<key>`` for a
    dedup key, apart, so that no task id can name a key's marker nor a key a task id's."""
    return f"dedup:{key}" if key else f"done:{task_id}"


def succeeded_as(marker: str) -> str | None:
    """The task id a dedup marker's value says succeeded: ``"1"`` (a task id's marker: its own,
    ``""``), ``"1:<task id>"`` (a key's); ``None`` for a claim (``<token>|<lease end>``)."""
    if marker == "1":
        return ""
    return marker[2:] if marker.startswith("1:") else None


class DeliveryGuard(Protocol):
    """The task-level questions of a delivery: how often was it delivered, did it succeed?

    Asked in the breaker's round trip when the task has a breaker (``BreakerStore.acquire``
    takes the ``DeliveryQuestions``), alone when it has none. ``scope`` is the breaker's name
    (its keys then share the breaker's hash tag) or ``None``.
    """

    def deliver(self, scope: str | None, delivery: DeliveryQuestions) -> tuple[int, Skip, int]:
        """The questions alone, for a task without a breaker: (deliveries, skip, µs until the
        claim another delivery holds ends: with skip ``claimed``, else 0). With skip ``""``
        the delivery claimed the task id if it asked to."""
        ...

    def mark_done(self, scope: str | None, task_id: str, ttl: int, key: str = "") -> None:
        """Remember that ``task_id`` succeeded, for ``ttl`` seconds (it replaces a claim); with
        ``key``, that the key succeeded as ``task_id``."""
        ...

    def unclaim(self, scope: str | None, task_id: str, claim: str, key: str = "") -> bool:
        """Give back the claim ``claim`` on ``task_id`` (or on ``key``) (the delivery did not
        succeed), if it is still held under that token: True if it was."""
        ...

    def claim_end(self, scope: str | None, task_id: str, key: str = "") -> int:
        """When the claim a delivery holds on ``task_id`` (or on ``key``) ends at the latest
        (epoch microseconds, the store's clock), 0 if none is held (it succeeded, or nothing
        runs it): what a delivery of the id waits for."""
        ...

    def done_by(self, scope: str | None, key: str) -> str | None:
        """The task id that ``key`` succeeded as, ``None`` if it did not (or its marker is gone)."""
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
        delivery: DeliveryQuestions | None = None,
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
        least_open_us: int = 0,
    ) -> Change:
        """The outcome of a permitted call; a failure that trips the breaker keeps it open at
        least ``least_open_us`` (the failure's Retry-After)."""
        ...

    def spend_retries(
        self,
        name: str,
        limits: Limits,
        ratio: float,
        floor: float,
        wanted: int = 1,
        now_us: int | None = None,
    ) -> int:
        """Take up to ``wanted`` retries from the breaker's retry budget (``model.spend_retries``):
        how many it granted."""
        ...

    def lease_rate(
        self,
        name: str,
        limits: Limits,
        span_us: int,
        burst_us: int,
        refused: int = 0,
        now_us: int | None = None,
    ) -> int:
        """Lease one batch of calls from the breaker's ``rate_limit`` (``model.lease_rate``):
        0 if granted, else microseconds until it would be; ``refused`` calls counted."""
        ...

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
        self,
        name: str,
        limits: Limits,
        action: Action,
        now_us: int | None = None,
        window: str = "",
        until_us: int = 0,
    ) -> Change:
        """An operator's order (``model.force``): ``window`` and ``until_us`` name the
        maintenance window an ``open`` order starts; every order drops the one held before."""
        ...

    def end_window(
        self,
        name: str,
        limits: Limits,
        window: str,
        now_us: int | None = None,
        recorded_us: int = 0,
    ) -> Change:
        """Reset the breaker if maintenance window ``window`` still holds it forced open and
        has ended (``model.end_window``; ``recorded_us``: when a record without an id was
        written): one atomic step."""
        ...

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
