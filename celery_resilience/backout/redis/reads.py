"""Reads of the Redis back-out store that the store and its filtered pages share: the counters
by status and breaker, entries' meta, entries by id, the index newest first."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import cast

import redis

from ...redis_io import unavailable
from ..codec import Codec
from ..entry import ParkedTask
from ..reading import read_entry
from ..store import Meta
from .keys import BackoutKeys


class EntryReads:
    """The shared reads of one Redis back-out store."""

    def __init__(self, client: redis.Redis, keys: BackoutKeys, codec: Codec) -> None:
        self.client = client
        self.keys = keys
        self.codec = codec

    def counters(self) -> dict[str, int]:
        """The ``status|<b>`` counters (``counts``)."""
        with unavailable("back-out store"):
            raw = cast(dict[bytes, bytes], self.client.hgetall(self.keys.counts))
        return {k.decode(): int(v) for k, v in raw.items()}

    def metas(self, ids: Sequence[str]) -> dict[str, Meta]:
        if not ids:
            return {}
        values = cast(list[bytes | None], self.client.hmget(self.keys.meta, list(ids)))
        return {i: Meta.decode(v) for i, v in zip(ids, values, strict=True) if v is not None}

    def load(self, ids: Sequence[tuple[str, float]]) -> builtins.list[ParkedTask]:
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

    def newest(self, start: int, count: int) -> builtins.list[tuple[bytes, float]]:
        """``count`` ids of the index from ``start``, newest ``parked_at`` first, with it."""
        page = self.client.zrevrange(self.keys.index, start, start + count - 1, withscores=True)
        return cast(builtins.list[tuple[bytes, float]], page)
