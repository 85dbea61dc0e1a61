"""The drain's side of the Redis back-out store: claim under a lease, ack after publish.

A claimed entry stays in its ready set with its score moved to the lease's end (``claim.lua``):
if the drainer dies before it acks, the entry is simply due again when the lease ends.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

import redis

from ..redis_io import redis_time, unavailable
from .codec import Codec
from .entry import ParkedTask
from .redis_keys import BackoutKeys
from .store import Meta, read_entry


class RedisClaims:
    """Mixed into ``RedisBackoutStore``, which provides the attributes declared here."""

    client: redis.Redis
    keys: BackoutKeys
    codec: Codec
    _claim: Any
    _release: Any

    def _delete_ids(self, ids: Sequence[str], breaker: str | None = None) -> int:
        raise NotImplementedError

    # -- the drain's side: claim under a lease, ack after publish ----------------------------

    def claim(
        self, breaker: str, limit: int, lease: float, now: float | None = None
    ) -> builtins.list[ParkedTask]:
        """Lease up to ``limit`` due entries of ``breaker`` (internal name) to the caller."""
        if limit <= 0:
            return []
        k = self.keys
        with unavailable("back-out store"):
            flat = self._claim(
                [k.ready(breaker), k.inflight, k.entries, k.meta],
                ["" if now is None else repr(now), limit, repr(lease)],
            )
        claimed = []
        for head, data in zip(flat[::2], flat[1::2], strict=True):
            entry_id, _, meta = head.partition(b"\n")
            claimed.append(read_entry(entry_id.decode(), data, Meta.decode(meta), 0.0, self.codec))
        return claimed

    def ack(self, breaker: str, entry_ids: Sequence[str]) -> int:
        """Remove entries of ``breaker`` that were published (the end of a claim)."""
        with unavailable("back-out store"):
            return self._delete_ids(entry_ids, breaker)

    def release(self, breaker: str, entry_ids: Sequence[str], due_at: float) -> int:
        """Give claimed entries back, due again at ``due_at`` (their publish failed)."""
        if not entry_ids:
            return 0
        with unavailable("back-out store"):
            keys = [self.keys.ready(breaker), self.keys.inflight]
            return int(self._release(keys, [repr(due_at), *entry_ids]))

    def in_flight(self) -> int:
        """Entries claimed by a drainer and not yet acked or given back."""
        with unavailable("back-out store"):
            now = redis_time(self.client, self.keys.tag)
            return int(self.client.zcount(self.keys.inflight, f"({now!r}", "+inf"))

    def due(self, breaker: str, now: float | None = None) -> int:
        """Entries of ``breaker`` due now (leased ones are due again when the lease ends)."""
        with unavailable("back-out store"):
            if now is None:
                now = redis_time(self.client, self.keys.tag)
            return int(self.client.zcount(self.keys.ready(breaker), "-inf", now))
