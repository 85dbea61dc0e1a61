"""Redis breaker store: one Lua script per atomic operation, time from Redis ``TIME``.

Key layout (every key of one breaker shares a hash tag, so Redis Cluster accepts the scripts):

=============================================  ====  =========================================
key                                            type  holds
=============================================  ====  =========================================
``{<prefix>:breaker:<name>}:state``            hash  state, counters, window buckets, totals
``{<prefix>:breaker:<name>}:probes``           zset  half-open probe permit id -> lease end
``{<prefix>:breaker:<name>}:calls``            zset  bulkhead slot: permit id -> lease end
``<prefix>:breakers``                          set   names of breakers ever used (listings)
``{<tag>}:delivery:<id>:<retries>:<replays>``  str   redeliveries of one message (only then)
``{<tag>}:done:<task id>``                     str   ``1``: the task id succeeded; or a claim,
                                                     ``<token>|<lease end µs>`` (``deduplicate``)
=============================================  ====  =========================================

Channel ``<prefix>:breaker-changes:<db>``: every change of a breaker's view (its state, and
whether a failure streak runs) is published there by the script that made it (see
``lua/_common.lua``). Pub/sub ignores the database number, so the channel names it: apps on other
databases of the server don't hear these. Each change also carries the epoch of the breaker's
hash, which a process checks against the epoch its own replies taught it (``views.py``).

``<tag>`` is the breaker's tag, so the acquire script can touch them, or ``<prefix>:tasks``
for tasks without a breaker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import redis

from ..redis_io import is_cluster, load_script
from .store import ChangeListener, Delivery, Watch
from .types import Action, Change, Decision, Kind, Limits, Skip, State, Transition
from .watch import RedisWatch

_INT_FIELDS = ("opened_at", "open_until")


class RedisBreakerStore:
    """Breakers kept in Redis under ``prefix``, shared by every process that uses the prefix."""

    def __init__(self, client: redis.Redis, prefix: str = "resilience") -> None:
        self.client = client
        self.prefix = prefix
        #: Where the scripts publish every change of a breaker's view: one per key prefix and
        #: database (pub/sub channels are server-wide, whatever database a client selected).
        self.channel = f"{prefix}:breaker-changes:{database(client)}"
        self._acquire = load_script(client, __package__, "acquire")
        self._record = load_script(client, __package__, "record")
        self._release = load_script(client, __package__, "release")
        self._force = load_script(client, __package__, "force")
        self._snapshot = load_script(client, __package__, "snapshot")
        self._deliver = load_script(client, __package__, "deliver", prelude=False)
        self._unclaim = load_script(client, __package__, "unclaim", prelude=False)
        self._known: set[str] = set()
        self._keys: dict[str, list[str]] = {}

    def _tag(self, scope: str | None) -> str:
        return f"{{{self.prefix}:breaker:{scope}}}" if scope else f"{{{self.prefix}:tasks}}"

    def keys(self, name: str) -> list[str]:
        keys = self._keys.get(name)
        if keys is None:
            tag = self._tag(name)
            keys = self._keys[name] = [f"{tag}:state", f"{tag}:probes", f"{tag}:calls"]
        return list(keys)

    def _delivery_keys(self, scope: str | None, delivery: Delivery) -> tuple[str, str]:
        tag = self._tag(scope)
        return (
            f"{tag}:delivery:{delivery.task_id}:{delivery.retries}:{delivery.replays}",
            f"{tag}:done:{delivery.task_id}",
        )

    def _remember(self, name: str) -> None:
        # One SADD per breaker and process, so that listings find breakers never forced.
        if name not in self._known:
            self.client.sadd(f"{self.prefix}:breakers", name)
            self._known.add(name)

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
        delivery: Delivery | None = None,
    ) -> Decision:
        self._remember(name)
        keys = self.keys(name)
        ttl = max_deliveries = lease_us = 0
        claim = ""
        if delivery is not None:
            counter, marker = self._delivery_keys(name, delivery)
            # KEYS[4] must be there for KEYS[5]; a TTL of 0 says it is not to be counted.
            keys += [counter, marker] if delivery.check_done else [counter] * delivery.count
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
        )

    def deliver(self, scope: str | None, delivery: Delivery) -> tuple[int, Skip, int]:
        keys = self._delivery_keys(scope, delivery)
        claim, lease_us = (delivery.claim, delivery.lease_us) if delivery.claims else ("", 0)
        argv = [delivery.ttl if delivery.count else 0, int(delivery.check_done), claim, lease_us]
        deliveries, skip, wait_us = self._deliver(keys, [*argv, delivery.max_deliveries])
        return int(deliveries), cast(Skip, skip.decode()), int(wait_us)

    def mark_done(self, scope: str | None, task_id: str, ttl: int) -> None:
        self.client.set(f"{self._tag(scope)}:done:{task_id}", 1, ex=ttl)

    def unclaim(self, scope: str | None, task_id: str, claim: str) -> bool:
        return bool(self._unclaim([f"{self._tag(scope)}:done:{task_id}"], [claim]))

    def record(
        self,
        name: str,
        limits: Limits,
        kind: Kind,
        permit_id: str,
        success: bool,
        deferred_successes: int = 0,
        now_us: int | None = None,
    ) -> Change:
        outcome = "1" if success else "0"
        argv = [*self._argv(name, limits, now_us), kind, permit_id, outcome, deferred_successes]
        return _change(self._record(self.keys(name), argv))

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
        return _change(self._release(self.keys(name), argv))

    def force(self, name: str, limits: Limits, action: Action, now_us: int | None = None) -> Change:
        self._remember(name)
        return _change(self._force(self.keys(name), [*self._argv(name, limits, now_us), action]))

    def snapshot(self, name: str, limits: Limits, now_us: int | None = None) -> dict[str, object]:
        flat = self._snapshot(self.keys(name), self._argv(name, limits, now_us))
        out: dict[str, Any] = {}
        for field, value in zip(flat[::2], flat[1::2], strict=True):
            out[field.decode()] = value.decode() if isinstance(value, bytes) else value
        for field in _INT_FIELDS:
            out[field] = out[field] / 1_000_000 if out[field] else None
        return out

    def watch(
        self, on_change: ChangeListener, on_live: Callable[[], None], on_lost: Callable[[], None]
    ) -> Watch:
        """Every view change the scripts publish, from a thread of this process."""
        return RedisWatch(self.client, self.channel, on_change, on_live, on_lost)


def database(client: redis.Redis) -> int:
    """The database number the client's commands run in (a cluster has only 0)."""
    if is_cluster(client):
        return 0
    return int(client.get_connection_kwargs().get("db") or 0)


def _now(now_us: int | None) -> int | str:
    return "" if now_us is None else now_us


def _transition(raw: bytes) -> Transition | None:
    return cast(Transition, raw.decode()) if raw else None


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def _change(reply: list[Any]) -> Change:
    state, transition, version, streak, epoch = reply
    return Change(
        cast(State, state.decode()),
        _transition(transition),
        int(version),
        bool(streak),
        _text(epoch),
    )
