"""Back-out store in Redis: a payload hash plus small indexes, changed only by Lua scripts.

The key layout is in ``redis_keys.py``; the drain's side (claim, ack, release) in
``redis_claims.py``.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import cast

import redis

from ..errors import ConfigurationError
from ..redis_io import NotReplicated, call_replicated, load_script, unavailable
from .codec import Codec
from .entry import ParkedTask
from .redis_claims import RedisClaims
from .redis_keys import BackoutKeys
from .redis_raw import RedisRaw
from .store import (
    ANY,
    NO_BREAKER,
    Filter,
    Meta,
    StoreFull,
    check_dead_reason,
    check_page,
    count_in,
    held,
    read_entry,
)

__all__ = ["BackoutKeys", "RedisBackoutStore"]  # BackoutKeys: the drain names its lock

_PAGE = 500
_RETRIES = 3


class RedisBackoutStore(RedisClaims, RedisRaw):
    """The back-out store shared by every worker that uses ``prefix`` on this Redis."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        serializer: str = "json",
        codec: Codec | None = None,
        max_entries: int = 1_000_000,
        dead_ttl: float | None = None,
        replicas: int = 0,
        replicas_timeout: float = 0.25,
    ) -> None:
        if not prefix or "{" in prefix or "}" in prefix:
            raise ConfigurationError(
                f"back-out key prefix must be non-empty, no braces: {prefix!r}"
            )
        self.client = client
        self.keys = BackoutKeys.for_prefix(prefix)
        #: Writes and reads entries: the serializer, signing and encryption keys.
        self.codec = codec or Codec(serializer)
        self.serializer = self.codec.serializer
        self.max_entries = max_entries
        self.dead_ttl = dead_ttl
        #: Replicas that must hold an entry (``WAIT``) before ``park`` returns; 0: none.
        self.replicas, self.replicas_timeout = replicas, replicas_timeout
        self._park = load_script(client, __package__, "park")
        self._delete = load_script(client, __package__, "delete")
        self._mark_dead = load_script(client, __package__, "mark_dead")
        self._expire_dead = load_script(client, __package__, "expire_dead")
        self._claim = load_script(client, __package__, "claim")
        self._release = load_script(client, __package__, "release")
        self._rewrite = load_script(client, __package__, "rewrite")

    # -- writes ---------------------------------------------------------------------------

    def park(self, entry: ParkedTask) -> None:
        data = self.codec.encode(entry)
        meta = Meta.of(entry)
        with unavailable("back-out store"):
            try:
                stored = self._put(
                    entry.id, data, meta, entry.parked_at, entry.due_at, self.max_entries
                )
            except NotReplicated as exc:  # its message stays in the broker: no second entry
                if exc.reply == 1:  # stored by this call, so taken back
                    self._delete_ids([entry.id], meta.breaker)
                raise
        if stored == -1:
            raise StoreFull(self.max_entries, entry.id)

    def _put(
        self, entry_id: str, data: bytes, meta: Meta, parked_at: float, due_at: float, limit: int
    ) -> int:
        k = self.keys
        keys = [k.entries, k.index, k.meta, k.counts, k.ready(meta.breaker), k.dead, k.stats]
        due = "+inf" if held(meta.reason) else repr(due_at)  # in its ready set, never due
        argv = [entry_id, data, meta.encode(), meta.counter, repr(parked_at), due, limit]
        argv += [meta.status, f"parked|{meta.breaker}|{meta.reason}"]
        if self.replicas:
            wait = self.replicas, self.replicas_timeout
            return int(call_replicated(self.client, self._park, keys, argv, *wait))
        return int(self._park(keys, argv))

    def stats(self) -> dict[str, float]:
        """Monotonic counters: ``parked|<b>|<reason>``, and what drains added (``bump``)."""
        with unavailable("back-out store"):
            raw = cast(dict[bytes, bytes], self.client.hgetall(self.keys.stats))
        return {k.decode(): float(v) for k, v in raw.items()}

    def bump(self, counters: dict[str, float]) -> None:
        """Add to counters (one round trip for all of them)."""
        if not counters:
            return
        with unavailable("back-out store"), self.client.pipeline(transaction=False) as pipe:
            for name, amount in counters.items():
                pipe.hincrbyfloat(self.keys.stats, name, amount)
            pipe.execute()

    def delete(self, entry_id: str) -> bool:
        with unavailable("back-out store"):
            return self._delete_ids([entry_id]) == 1

    def purge(self, where: Filter = ANY) -> int:
        deleted = 0
        with unavailable("back-out store"):
            # ZSCAN returns every id present for the whole scan, while we delete as we go.
            page: list[str] = []
            for member, _ in self.client.zscan_iter(self.keys.index, count=_PAGE):
                page.append(member.decode())
                if len(page) >= _PAGE:
                    deleted += self._purge_page(page, where)
                    page = []
            deleted += self._purge_page(page, where)
        return deleted

    def _purge_page(self, ids: list[str], where: Filter) -> int:
        if where != ANY:
            metas = self._metas(ids)
            ids = [i for i in ids if (m := metas.get(i)) and where.matches(m)]
        return self._delete_ids(ids)

    def _delete_ids(self, ids: Sequence[str], breaker: str | None = None) -> int:
        """Delete ``ids`` with ``delete.lua``, which needs each one's breaker (keys in KEYS):
        ``breaker`` when the caller knows it (a drain's ack), else read from meta first."""
        deleted = 0
        k = self.keys
        for _ in range(_RETRIES):
            if not ids:
                break
            if breaker is not None:
                known = dict.fromkeys(ids, breaker)
                breaker = None  # a mismatch found below is read from meta on the next round
            else:
                known = {i: m.breaker for i, m in self._metas(ids).items()}
            ready: dict[str, int] = {}
            argv: list[str | int] = []
            for entry_id in ids:
                name = known.get(entry_id)
                position = ready.setdefault(name or NO_BREAKER, 7 + len(ready))
                argv += [entry_id, name or "", position]
            keys = [k.entries, k.index, k.meta, k.counts, k.dead, k.inflight]
            keys += [k.ready(b) for b in ready]
            results = self._delete(keys, argv)
            deleted += sum(1 for r in results if r == 1)
            ids = [i for i, r in zip(ids, results, strict=True) if r == -1]
        return deleted

    def mark_dead(self, entry_id: str, dead_reason: str) -> bool:
        check_dead_reason(dead_reason)
        k = self.keys
        with unavailable("back-out store"):
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
        with unavailable("back-out store"):
            while True:
                batch = int(
                    self._expire_dead(
                        [k.entries, k.index, k.meta, k.counts, k.dead], [self.dead_ttl, _PAGE]
                    )
                )
                removed += batch
                if batch < _PAGE:
                    return removed

    # -- reads ----------------------------------------------------------------------------

    def get(self, entry_id: str) -> ParkedTask | None:
        with unavailable("back-out store"):
            pipe = self.client.pipeline(transaction=False)
            pipe.hget(self.keys.entries, entry_id)
            pipe.hget(self.keys.meta, entry_id)
            pipe.zscore(self.keys.index, entry_id)
            data, meta, parked_at = pipe.execute()
        if data is None or meta is None:
            return None
        return read_entry(entry_id, data, Meta.decode(meta), parked_at or 0.0, self.codec)

    def count(self, where: Filter = ANY) -> int:
        if where.reason is None:
            return count_in(self._counters(), where)
        # Counters are kept per status and breaker only: a reason means reading every meta
        # (HSCAN may return a field twice, hence the set).
        with unavailable("back-out store"):
            scan = self.client.hscan_iter(self.keys.meta, count=_PAGE)
            return len({i for i, m in scan if where.matches(Meta.decode(m))})

    def breakers(self) -> set[str]:
        return {counter.partition("|")[2] for counter, n in self._counters().items() if n > 0}

    def list(
        self, where: Filter = ANY, limit: int = 100, offset: int = 0
    ) -> builtins.list[ParkedTask]:
        check_page(limit, offset)
        if limit == 0:
            return []
        with unavailable("back-out store"):
            if where == ANY:
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
                    if meta is None or not where.matches(meta):
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
            read_entry(entry_id, data, Meta.decode(meta), parked_at, self.codec)
            for (entry_id, parked_at), data, meta in zip(ids, payloads, metas, strict=True)
            if data is not None and meta is not None
        ]

    def _metas(self, ids: Sequence[str]) -> dict[str, Meta]:
        if not ids:
            return {}
        values = cast(list[bytes | None], self.client.hmget(self.keys.meta, list(ids)))
        return {i: Meta.decode(v) for i, v in zip(ids, values, strict=True) if v is not None}

    def _counters(self) -> dict[str, int]:
        with unavailable("back-out store"):
            raw = cast(dict[bytes, bytes], self.client.hgetall(self.keys.counts))
        return {k.decode(): int(v) for k, v in raw.items()}
