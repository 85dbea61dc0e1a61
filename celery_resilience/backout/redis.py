"""Back-out store in Redis: a payload hash plus small indexes, changed only by Lua scripts.

Every key shares the hash tag ``{<P>:backout}`` (``P`` = the key prefix), so each script's keys
live in one Redis Cluster slot. ``<b>`` is a breaker name, ``-`` for entries without a breaker.

=================================  ====  ===========================================================
key                                type  holds
=================================  ====  ===========================================================
``{P:backout}:entries``            hash  entry id -> encoded ``ParkedTask`` (see ``entry.py``)
``{P:backout}:index``              zset  entry id -> parked_at, every entry (newest-first listing)
``{P:backout}:meta``               hash  entry id -> ``status|reason|dead_reason|breaker``
``{P:backout}:counts``             hash  ``status|<b>`` -> number of entries (O(1) count)
``{P:backout}:ready:<b>``          zset  entry id -> due_at, parked entries waiting for a drain
``{P:backout}:dead``               zset  entry id -> time it died (Redis ``TIME``, seconds)
``{P:backout}:inflight``           zset  entry id -> lease expiry; reserved for the drain
``{P:backout}:stats``              hash  monotonic counters for metrics (parks, replays, drains)
=================================  ====  ===========================================================

``meta`` is authoritative for status: a claimed (in-flight) entry keeps ``parked`` there and in
``counts`` until the drain acks it (``delete.lua``) or marks it dead (``mark_dead.lua``); both
scripts already take the in-flight key. Times are float epoch seconds.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any, cast

import redis

from ..errors import ConfigurationError, StoreUnavailable
from .entry import ParkedTask, encode, store_accept
from .store import (
    NO_BREAKER,
    Meta,
    StoreFull,
    breaker_key,
    check_dead_reason,
    check_filters,
    check_page,
    count_in,
    read_entry,
)

_PAGE = 500
_RETRIES = 3


def _script(client: redis.Redis, name: str) -> Any:
    text = resources.files(__package__).joinpath("lua").joinpath(f"{name}.lua").read_text()
    return client.register_script(text)


_UNAVAILABLE = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
)


@contextmanager
def _reachable() -> Iterator[None]:
    """Redis trouble becomes ``StoreUnavailable``: callers catch one of our errors.

    A Redis at ``maxmemory`` (OOM) or a replica after a failover (READONLY) can't take a park
    either: the task must wait in the broker, exactly as when Redis is down.
    """
    try:
        yield
    except _UNAVAILABLE as exc:
        raise StoreUnavailable(f"back-out store unavailable: {exc}") from exc


@dataclass(frozen=True)
class BackoutKeys:
    """Names of the store's keys (the drain's scripts take theirs from here too)."""

    tag: str
    entries: str
    index: str
    meta: str
    counts: str
    dead: str
    inflight: str
    stats: str

    @classmethod
    def for_prefix(cls, prefix: str) -> BackoutKeys:
        tag = f"{{{prefix}:backout}}"
        names = ("entries", "index", "meta", "counts", "dead", "inflight", "stats")
        return cls(tag, *(f"{tag}:{name}" for name in names))

    def ready(self, breaker: str) -> str:
        """Ready set of a breaker's internal name (``NO_BREAKER`` for none)."""
        return f"{self.tag}:ready:{breaker}"


class RedisBackoutStore:
    """The back-out store shared by every worker that uses ``prefix`` on this Redis."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        serializer: str = "json",
        accept: Collection[str] | None = None,
        max_entries: int = 1_000_000,
        dead_ttl: float | None = None,
    ) -> None:
        if not prefix or "{" in prefix or "}" in prefix:
            raise ConfigurationError(
                f"back-out key prefix must be non-empty, no braces: {prefix!r}"
            )
        self.client = client
        self.keys = BackoutKeys.for_prefix(prefix)
        self.serializer = serializer
        self.accept = store_accept(serializer, accept)
        self.max_entries = max_entries
        self.dead_ttl = dead_ttl
        self._park = _script(client, "park")
        self._delete = _script(client, "delete")
        self._mark_dead = _script(client, "mark_dead")
        self._expire_dead = _script(client, "expire_dead")
        self._claim = _script(client, "claim")
        self._release = _script(client, "release")

    # -- writes ---------------------------------------------------------------------------

    def park(self, entry: ParkedTask) -> None:
        data = encode(entry, self.serializer)
        meta = Meta.of(entry)
        with _reachable():
            stored = self._put(
                entry.id, data, meta, entry.parked_at, entry.due_at, self.max_entries
            )
        if stored == -1:
            raise StoreFull(self.max_entries, entry.id)

    def _put(
        self, entry_id: str, data: bytes, meta: Meta, parked_at: float, due_at: float, limit: int
    ) -> int:
        k = self.keys
        keys = [k.entries, k.index, k.meta, k.counts, k.ready(meta.breaker), k.dead, k.stats]
        argv = [entry_id, data, meta.encode(), meta.counter, repr(parked_at), repr(due_at), limit]
        stat = f"parked|{meta.breaker}|{meta.reason}"
        return int(self._park(keys, [*argv, meta.status, stat]))

    def stats(self) -> dict[str, float]:
        """Monotonic counters: ``parked|<b>|<reason>``, and what drains added (``bump``)."""
        with _reachable():
            raw = cast(dict[bytes, bytes], self.client.hgetall(self.keys.stats))
        return {k.decode(): float(v) for k, v in raw.items()}

    def bump(self, counters: dict[str, float]) -> None:
        """Add to counters (one round trip for all of them)."""
        if not counters:
            return
        with _reachable(), self.client.pipeline(transaction=False) as pipe:
            for name, amount in counters.items():
                pipe.hincrbyfloat(self.keys.stats, name, amount)
            pipe.execute()

    def delete(self, entry_id: str) -> bool:
        with _reachable():
            return self._delete_ids([entry_id]) == 1

    def purge(
        self, breaker: str | None = None, status: str | None = None, reason: str | None = None
    ) -> int:
        check_filters(status, reason)
        deleted = 0
        with _reachable():
            # ZSCAN returns every id present for the whole scan, while we delete as we go.
            page: list[str] = []
            for member, _ in self.client.zscan_iter(self.keys.index, count=_PAGE):
                page.append(member.decode())
                if len(page) >= _PAGE:
                    deleted += self._purge_page(page, breaker, status, reason)
                    page = []
            deleted += self._purge_page(page, breaker, status, reason)
        return deleted

    def _purge_page(
        self, ids: list[str], breaker: str | None, status: str | None, reason: str | None
    ) -> int:
        if breaker is not None or status is not None or reason is not None:
            metas = self._metas(ids)
            ids = [i for i in ids if (m := metas.get(i)) and m.matches(breaker, status, reason)]
        return self._delete_ids(ids)

    def _delete_ids(self, ids: Sequence[str]) -> int:
        """Delete ``ids`` with ``delete.lua``, reading each one's breaker first (keys in KEYS)."""
        deleted = 0
        k = self.keys
        for _ in range(_RETRIES):
            if not ids:
                break
            metas = self._metas(ids)
            ready: dict[str, int] = {}
            argv: list[str | int] = []
            for entry_id in ids:
                meta = metas.get(entry_id)
                breaker = meta.breaker if meta else NO_BREAKER
                position = ready.setdefault(breaker, 7 + len(ready))
                argv += [entry_id, breaker if meta else "", position]
            keys = [k.entries, k.index, k.meta, k.counts, k.dead, k.inflight]
            keys += [k.ready(b) for b in ready]
            results = self._delete(keys, argv)
            deleted += sum(1 for r in results if r == 1)
            ids = [i for i, r in zip(ids, results, strict=True) if r == -1]
        return deleted

    def mark_dead(self, entry_id: str, dead_reason: str) -> bool:
        check_dead_reason(dead_reason)
        k = self.keys
        with _reachable():
            for _ in range(_RETRIES):
                meta = self._metas([entry_id]).get(entry_id)
                if meta is None:
                    return False
                result = self._mark_dead(
                    [k.meta, k.counts, k.dead, k.inflight, k.ready(meta.breaker)],
                    [entry_id, dead_reason, meta.breaker],
                )
                if result != -1:
                    return bool(result == 1)
        return False

    def expire_dead(self) -> int:
        if self.dead_ttl is None:
            return 0
        k = self.keys
        removed = 0
        with _reachable():
            while True:
                batch = int(
                    self._expire_dead(
                        [k.entries, k.index, k.meta, k.counts, k.dead], [self.dead_ttl, _PAGE]
                    )
                )
                removed += batch
                if batch < _PAGE:
                    return removed

    # -- the drain's side: claim under a lease, ack after publish ----------------------------

    def claim(
        self, breaker: str, limit: int, lease: float, now: float | None = None
    ) -> builtins.list[ParkedTask]:
        """Lease up to ``limit`` due entries of ``breaker`` (internal name) to the caller."""
        if limit <= 0:
            return []
        k = self.keys
        with _reachable():
            flat = self._claim(
                [k.ready(breaker), k.inflight, k.entries, k.meta, k.index],
                ["" if now is None else repr(now), limit, repr(lease)],
            )
        return [
            read_entry(i.decode(), data, Meta.decode(meta), float(parked_at), self.accept)
            for i, data, meta, parked_at in zip(
                flat[::4], flat[1::4], flat[2::4], flat[3::4], strict=True
            )
        ]

    def ack(self, entry_ids: Sequence[str]) -> int:
        """Remove entries that were published (the end of a claim)."""
        with _reachable():
            return self._delete_ids(entry_ids)

    def release(self, breaker: str, entry_ids: Sequence[str], due_at: float) -> int:
        """Give claimed entries back, due again at ``due_at`` (their publish failed)."""
        if not entry_ids:
            return 0
        with _reachable():
            keys = [self.keys.ready(breaker), self.keys.inflight]
            return int(self._release(keys, [repr(due_at), *entry_ids]))

    def in_flight(self) -> int:
        """Entries claimed by a drainer and not yet acked or given back."""
        with _reachable():
            seconds, micros = self.client.time()
            now = seconds + micros / 1e6
            return int(self.client.zcount(self.keys.inflight, f"({now!r}", "+inf"))

    def due(self, breaker: str, now: float | None = None) -> int:
        """Entries of ``breaker`` due now (leased ones are due again when the lease ends)."""
        with _reachable():
            if now is None:
                seconds, micros = self.client.time()
                now = seconds + micros / 1e6
            return int(self.client.zcount(self.keys.ready(breaker), "-inf", now))

    # -- reads ----------------------------------------------------------------------------

    def get(self, entry_id: str) -> ParkedTask | None:
        with _reachable():
            pipe = self.client.pipeline(transaction=False)
            pipe.hget(self.keys.entries, entry_id)
            pipe.hget(self.keys.meta, entry_id)
            pipe.zscore(self.keys.index, entry_id)
            data, meta, parked_at = pipe.execute()
        if data is None or meta is None:
            return None
        return read_entry(entry_id, data, Meta.decode(meta), parked_at or 0.0, self.accept)

    def count(self, breaker: str | None = None, status: str | None = None) -> int:
        check_filters(status)
        return count_in(self._counters(), breaker, status)

    def breakers(self) -> set[str]:
        return {counter.partition("|")[2] for counter, n in self._counters().items() if n > 0}

    def list(
        self,
        breaker: str | None = None,
        status: str | None = None,
        reason: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> builtins.list[ParkedTask]:
        check_filters(status, reason)
        check_page(limit, offset)
        if limit == 0:
            return []
        with _reachable():
            if breaker is None and status is None and reason is None:
                page = self._newest(offset, limit)
                return self._load([(m.decode(), s) for m, s in page])
            chosen: list[tuple[str, float]] = []
            skip, start = offset, 0
            while len(chosen) < limit:
                page = self._newest(start, _PAGE)
                if not page:
                    break
                start += _PAGE
                metas = self._metas([m.decode() for m, _ in page])
                for member, score in page:
                    meta = metas.get(member.decode())
                    if meta is None or not meta.matches(breaker, status, reason):
                        continue
                    if skip:
                        skip -= 1
                    elif len(chosen) < limit:
                        chosen.append((member.decode(), score))
            return self._load(chosen)

    def _newest(self, start: int, count: int) -> builtins.list[tuple[bytes, float]]:
        page = self.client.zrevrange(self.keys.index, start, start + count - 1, withscores=True)
        return cast(builtins.list[tuple[bytes, float]], page)

    def _load(self, ids: Sequence[tuple[str, float]]) -> builtins.list[ParkedTask]:
        """Entries of ``(id, parked_at)`` in order; ones deleted meanwhile are left out."""
        if not ids:
            return []
        names = [i for i, _ in ids]
        pipe = self.client.pipeline(transaction=False)
        pipe.hmget(self.keys.entries, names)
        pipe.hmget(self.keys.meta, names)
        payloads, metas = pipe.execute()
        return [
            read_entry(entry_id, data, Meta.decode(meta), parked_at, self.accept)
            for (entry_id, parked_at), data, meta in zip(ids, payloads, metas, strict=True)
            if data is not None and meta is not None
        ]

    def _metas(self, ids: Sequence[str]) -> dict[str, Meta]:
        if not ids:
            return {}
        values = cast(list[bytes | None], self.client.hmget(self.keys.meta, list(ids)))
        return {i: Meta.decode(v) for i, v in zip(ids, values, strict=True) if v is not None}

    def _counters(self) -> dict[str, int]:
        with _reachable():
            raw = cast(dict[bytes, bytes], self.client.hgetall(self.keys.counts))
        return {k.decode(): int(v) for k, v in raw.items()}

    # -- tests only -----------------------------------------------------------------------

    def _put_raw(
        self,
        entry_id: str,
        data: bytes,
        *,
        breaker: str | None = None,
        reason: str = "park_on",
        parked_at: float | None = None,
    ) -> None:
        """Store raw payload bytes (replacing an entry's, or as a new parked entry): tests only."""
        if self.client.hexists(self.keys.meta, entry_id):
            self.client.hset(self.keys.entries, entry_id, data)
            return
        meta = Meta(breaker_key(breaker), "parked", reason)  # type: ignore[arg-type]
        when = time.time() if parked_at is None else parked_at
        self._put(entry_id, data, meta, when, when, 2**62)
