"""Redis breaker store: one Lua script per atomic operation, time from Redis ``TIME``.

Key layout (every key of one breaker shares a hash tag, so Redis Cluster accepts the scripts):

=============================================  ====  =========================================
key                                            type  holds
=============================================  ====  =========================================
``{<prefix>:breaker:<name>}:state``            hash  state, counters, window buckets, totals,
                                                     the maintenance window holding it open,
                                                     the rate limit's GCRA (``rate_tat``)
``{<prefix>:breaker:<name>}:probes``           zset  half-open probe permit id -> lease end
``{<prefix>:breaker:<name>}:calls``            zset  bulkhead slot: permit id -> lease end
``<prefix>:breakers``                          set   names of breakers ever used (listings)
``{<tag>}:delivery:<id>:<retries>:<replays>``  str   redeliveries of one message (only then)
``{<tag>}:done:<task id>``                     str   ``1``: the task id succeeded; or a claim,
                                                     ``<token>|<lease end µs>`` (``deduplicate``)
``{<tag>}:dedup:<task name>:<key>``            str   ``1:<task id>``: the key succeeded as that
                                                     task id; or a claim, as above (a dedup key,
                                                     ``deduplicate="order:{order_id}"``); the
                                                     task id's ``done:`` is read beside it
=============================================  ====  =========================================

Channel ``<prefix>:breaker-changes:<db>``: every change of a breaker's view (its state, and
whether a failure streak runs) is published there by the script that made it (see
``lua/_common.lua``). Pub/sub ignores the database number, so the channel names it: apps on other
databases of the server don't hear these. Each change also carries the epoch of the breaker's
hash, which a process checks against the epoch its own replies taught it (``knowledge.py``).

``<tag>`` is the breaker's tag, so the acquire script can touch them, or ``<prefix>:tasks``
for tasks without a breaker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import redis

from ..redis_io import database, load_script
from .store import (
    ChangeListener,
    DeliveryQuestions,
    FamilyReport,
    Watch,
    marker_of,
    succeeded_as,
)
from .types import Action, Change, Decision, Family, Kind, Limits, Skip, State, Transition
from .watch import RedisWatch

_INT_FIELDS = ("opened_at", "open_until")


class RedisBreakerStore:
    """Breakers kept in Redis under ``prefix``, shared by every process that uses the prefix."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str = "resilience",
        family_of: Callable[[str], str | None] = lambda name: None,
    ) -> None:
        self.client = client
        self.prefix = prefix
        #: The declared base of a derived breaker's name, ``None`` for any other (the config's).
        self.family_of = family_of
        #: Where the scripts publish every change of a breaker's view: one per key prefix and
        #: database (pub/sub channels are server-wide, whatever database a client selected).
        self.channel = f"{prefix}:breaker-changes:{database(client)}"
        self._acquire = load_script(client, __package__, "acquire")
        self._record = load_script(client, __package__, "record")
        self._release_permit = load_script(client, __package__, "release_permit")
        self._force = load_script(client, __package__, "force")
        self._end_window = load_script(client, __package__, "end_window")
        self._snapshot = load_script(client, __package__, "snapshot")
        self._retry = load_script(client, __package__, "retry")
        self._rate = load_script(client, __package__, "rate")
        self._deliver = load_script(client, __package__, "deliver", prelude=False)
        self._unclaim = load_script(client, __package__, "unclaim", prelude=False)
        self._family = load_script(client, __package__, "family", prelude=False)
        self._known: set[str] = set()
        self._keys: dict[str, list[str]] = {}

    def _tag(self, scope: str | None) -> str:
        if not scope:
            return f"{{{self.prefix}:tasks}}"
        # A derived breaker lives under its base's tag: one slot for the family's scripts.
        return f"{{{self.prefix}:breaker:{self.family_of(scope) or scope}}}"

    def keys(self, name: str) -> list[str]:
        """The script's KEYS[1..6]: the breaker's state, probes, calls, then its family's."""
        keys = self._keys.get(name)
        if keys is not None:
            return list(keys)
        base = self.family_of(name)
        tag = self._tag(base or name)
        own = f"{tag}:key:{name[len(base) + 1 :]}" if base else tag
        keys = [f"{own}:state", f"{own}:probes", f"{own}:calls", *self.family_keys(base or name)]
        if base is None:  # declared names are few; derived ones are not kept
            self._keys[name] = keys
        return list(keys)

    def family_keys(self, base: str) -> list[str]:
        """A family's hash (version, epoch, totals), members and troubled members."""
        tag = self._tag(base)
        return [f"{tag}:family", f"{tag}:members", f"{tag}:troubled"]

    def _delivery_keys(self, scope: str | None, delivery: DeliveryQuestions) -> list[str]:
        """The redelivery counter and the dedup marker; with a dedup key, the task id's own
        marker too (a task id that succeeded under ``deduplicate=True`` before the task had a
        key is done all the same)."""
        tag = self._tag(scope)
        keys = [
            f"{tag}:delivery:{delivery.task_id}:{delivery.retries}:{delivery.replays}",
            f"{tag}:{delivery.marker}",
        ]
        if delivery.key:
            keys.append(f"{tag}:{marker_of(delivery.task_id)}")
        return keys

    def _remember(self, name: str) -> None:
        # One SADD per breaker and process, so that listings find breakers never forced; a
        # derived breaker is listed through its family, its base in the set.
        name = self.family_of(name) or name
        if name not in self._known:
            self.client.sadd(f"{self.prefix}:breakers", name)
            self._known.add(name)

    def _derived(self, name: str) -> bool:
        return self.family_of(name) is not None

    def _family_of_reply(self, name: str, reply: list[Any]) -> Family | None:
        return _family(reply) if self._derived(name) else None

    def names(self) -> set[str]:
        return {
            n.decode() for n in cast(set[bytes], self.client.smembers(f"{self.prefix}:breakers"))
        }

    def _argv(self, name: str, limits: Limits, now_us: int | None) -> list[int | float | str]:
        """The prelude's arguments (``lua/_common.lua``): time, limits, name, channel."""
        return [_now(now_us), *limits.argv(), name, self.channel]

    def acquire(
        self,
        name: str,
        limits: Limits,
        permit_id: str,
        deferred_successes: int = 0,
        now_us: int | None = None,
        delivery: DeliveryQuestions | None = None,
    ) -> Decision:
        self._remember(name)
        keys = self.keys(name)
        ttl = max_deliveries = lease_us = 0
        claim = ""
        if delivery is not None:
            counter, *markers = self._delivery_keys(name, delivery)
            # KEYS[7] must be there for KEYS[8]; a TTL of 0 says it is not to be counted.
            keys += [counter, *markers] if delivery.check_done else [counter] * delivery.count
            ttl = delivery.ttl if delivery.count else 0
            max_deliveries = delivery.max_deliveries
            claim, lease_us = (delivery.claim, delivery.lease_us) if delivery.claims else ("", 0)
        argv = [*self._argv(name, limits, now_us), permit_id, deferred_successes, ttl]
        reply = self._acquire(keys, [*argv, max_deliveries, claim, lease_us])
        allowed, kind, state, retry_after, transition, deliveries, skip, version, streak = reply[:9]
        claimed = skip == b"claimed"  # then retry_after is the claim's, not the breaker's
        full = kind == b"full"  # a rejection by the bulkhead, not by the breaker's state
        return Decision(
            allowed=bool(allowed),
            kind=cast(Kind, kind.decode()) if kind and not full else None,
            state=cast(State, state.decode()),
            retry_after_us=None if retry_after < 0 or claimed else int(retry_after),
            transition=_transition(transition),
            deliveries=int(deliveries),
            skip=cast(Skip, skip.decode()),
            claim_wait_us=int(retry_after) if claimed else 0,
            version=int(version),
            streak=bool(streak),
            epoch=_text(reply[9]),
            full=full,
            family=self._family_of_reply(name, reply[10:12]),
            family_changed=bool(reply[12]) if len(reply) > 12 else False,
        )

    def deliver(self, scope: str | None, delivery: DeliveryQuestions) -> tuple[int, Skip, int]:
        keys = self._delivery_keys(scope, delivery)
        claim, lease_us = (delivery.claim, delivery.lease_us) if delivery.claims else ("", 0)
        argv = [delivery.ttl if delivery.count else 0, int(delivery.check_done), claim, lease_us]
        deliveries, skip, wait_us = self._deliver(keys, [*argv, delivery.max_deliveries])
        return int(deliveries), cast(Skip, skip.decode()), int(wait_us)

    def mark_done(self, scope: str | None, task_id: str, ttl: int, key: str = "") -> None:
        done = f"1:{task_id}" if key else "1"  # a key's marker names the id it succeeded as
        self.client.set(f"{self._tag(scope)}:{marker_of(task_id, key)}", done, ex=ttl)

    def unclaim(self, scope: str | None, task_id: str, claim: str, key: str = "") -> bool:
        return bool(self._unclaim([f"{self._tag(scope)}:{marker_of(task_id, key)}"], [claim]))

    def claim_end(self, scope: str | None, task_id: str, key: str = "") -> int:
        marker = _text(self.client.get(f"{self._tag(scope)}:{marker_of(task_id, key)}") or b"")
        if succeeded_as(marker) is not None:
            return 0
        _, bar, end = marker.partition("|")  # "<token>|<lease end µs>"
        return int(end) if bar and end.isdigit() else 0

    def done_by(self, scope: str | None, key: str) -> str | None:
        marker = self.client.get(f"{self._tag(scope)}:{marker_of('', key)}")
        return succeeded_as(_text(marker)) if marker else None

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
        outcome = "1" if success else "0"
        argv = [*self._argv(name, limits, now_us), kind, permit_id, outcome, deferred_successes]
        if least_open_us > 0:  # only then: a script of an older release reads no ARGV[19]
            argv.append(least_open_us)
        return _change(self._record(self.keys(name), argv), self._derived(name))

    def spend_retries(
        self,
        name: str,
        limits: Limits,
        ratio: float,
        floor: float,
        wanted: int = 1,
        now_us: int | None = None,
    ) -> int:
        argv = [*self._argv(name, limits, now_us), ratio, floor, wanted]
        return int(self._retry(self.keys(name), argv)[0])

    def lease_rate(
        self,
        name: str,
        limits: Limits,
        span_us: int,
        burst_us: int,
        refused: int = 0,
        now_us: int | None = None,
    ) -> int:
        argv = [*self._argv(name, limits, now_us), span_us, burst_us, refused]
        return int(self._rate(self.keys(name), argv)[0])

    def release(
        self,
        name: str,
        limits: Limits,
        kind: Kind,
        permit_id: str,
        deferred_successes: int = 0,
        now_us: int | None = None,
    ) -> Change:
        argv = [*self._argv(name, limits, now_us), kind, permit_id, deferred_successes]
        return _change(self._release_permit(self.keys(name), argv), self._derived(name))

    def force(
        self,
        name: str,
        limits: Limits,
        action: Action,
        now_us: int | None = None,
        window: str = "",
        until_us: int = 0,
    ) -> Change:
        self._remember(name)
        argv = [*self._argv(name, limits, now_us), action, window, until_us]
        return _change(self._force(self.keys(name), argv), self._derived(name))

    def end_window(
        self,
        name: str,
        limits: Limits,
        window: str,
        now_us: int | None = None,
        recorded_us: int = 0,
    ) -> Change:
        argv = [*self._argv(name, limits, now_us), window, recorded_us]
        return _change(self._end_window(self.keys(name), argv), self._derived(name))

    def snapshot(self, name: str, limits: Limits, now_us: int | None = None) -> dict[str, object]:
        flat = self._snapshot(self.keys(name), self._argv(name, limits, now_us))
        out: dict[str, Any] = {}
        for field, value in zip(flat[::2], flat[1::2], strict=True):
            out[field.decode()] = value.decode() if isinstance(value, bytes) else value
        for field in _INT_FIELDS:
            out[field] = out[field] / 1_000_000 if out[field] else None
        return out

    def family(
        self,
        base: str,
        idle_us: int,
        successes: int = 0,
        most: int = 1000,
        now_us: int | None = None,
    ) -> FamilyReport:
        """What the family of ``base``'s derived breakers looks like now (``lua/family.lua``):
        its version and epoch, how many members are troubled (not closed without a streak) and
        their names when at most ``most``; idle members are forgotten first, and ``successes``
        (held back by this process) added to the family's totals."""
        tag = self._tag(base)
        argv = [_now(now_us), idle_us, most, self.channel, successes, f"{tag}:key:", f"{base}:"]
        reply = self._family(self.family_keys(base), argv)
        names = frozenset(_text(name) for name in reply[3:])
        complete = int(reply[2]) <= most
        return FamilyReport(int(reply[0]), _text(reply[1]), int(reply[2]), names, complete)

    def members(self, base: str, limit: int = 100) -> list[str]:
        """The family's members written last, newest first (listings; idle ones are pruned by
        :meth:`family`)."""
        raw = self.client.zrevrange(self.family_keys(base)[1], 0, limit - 1)
        return [_text(name) for name in cast(list[bytes], raw)]

    def family_size(self, base: str) -> tuple[int, int]:
        """(members, troubled members) of the family of ``base``."""
        members, troubled = self.family_keys(base)[1:]
        with self.client.pipeline(transaction=False) as pipe:
            pipe.zcard(members)
            pipe.zcard(troubled)
            sizes = pipe.execute()
        return int(sizes[0]), int(sizes[1])

    def troubled(self, base: str, limit: int = 100) -> list[str]:
        """Members of the family of ``base`` that are not closed without a streak."""
        raw = self.client.zrevrange(self.family_keys(base)[2], 0, limit - 1)
        return [_text(name) for name in cast(list[bytes], raw)]

    def watch(
        self, on_change: ChangeListener, on_live: Callable[[], None], on_lost: Callable[[], None]
    ) -> Watch:
        """Every view change the scripts publish, from a thread of this process."""
        return RedisWatch(self.client, self.channel, on_change, on_live, on_lost)


def _now(now_us: int | None) -> int | str:
    return "" if now_us is None else now_us


def _transition(raw: bytes) -> Transition | None:
    return cast(Transition, raw.decode()) if raw else None


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def _change(reply: list[Any], derived: bool) -> Change:
    state, transition, version, streak, epoch = reply[:5]
    return Change(
        cast(State, state.decode()),
        _transition(transition),
        int(version),
        bool(streak),
        _text(epoch),
        _family(reply[5:7]) if derived else None,
        bool(reply[7]) if derived else False,
    )


def _family(reply: list[Any]) -> Family:
    """(family version, family epoch) from the end of a derived breaker's reply."""
    return int(reply[0]), _text(reply[1])
