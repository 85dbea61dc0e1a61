"""Raw bytes of the Redis back-out store: the key rotation command's reads and rewrites, and
the tests' way to write bytes no codec would."""

from __future__ import annotations

import builtins
import time
from typing import Any, cast

import redis

from ..redis_io import unavailable
from .redis_keys import BackoutKeys
from .store import Meta, breaker_key, check_page


class RedisRaw:
    """Mixed into ``RedisBackoutStore``, which provides the attributes declared here."""

    client: redis.Redis
    keys: BackoutKeys
    _rewrite: Any

    def _newest(self, start: int, count: int) -> builtins.list[tuple[bytes, float]]:
        raise NotImplementedError

    def _put(
        self, entry_id: str, data: bytes, meta: Meta, parked_at: float, due_at: float, limit: int
    ) -> int:
        raise NotImplementedError

    def payloads(self, offset: int, limit: int) -> builtins.list[tuple[str, bytes]]:
        check_page(limit, offset)
        with unavailable("back-out store"):
            ids = [m.decode() for m, _ in self._newest(offset, limit)] if limit else []
            data = (
                cast(list[bytes | None], self.client.hmget(self.keys.entries, ids)) if ids else []
            )
        return [(i, d) for i, d in zip(ids, data, strict=True) if d is not None]

    def rewrite(self, entry_id: str, old: bytes, new: bytes) -> bool:
        with unavailable("back-out store"):
            return bool(self._rewrite([self.keys.entries], [entry_id, old, new]) == 1)

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
