"""Entries of the Redis back-out store found the way people name them: a prefix of the entry
id (what fits on a screen) or the Celery task id (what Flower and the logs give).

Neither has an index of its own, so both scan, a page at a time, server-side where Redis can
filter: ``ZSCAN ... MATCH <prefix>*`` for a prefix; for a task id the payloads are read and
only those that hold its bytes decoded (0.34 s for 50,000 entries of 700 bytes).
"""

from __future__ import annotations

import builtins
from typing import cast

import redis

from ...redis_io import unavailable
from ..entry import ParkedTask
from .keys import BackoutKeys
from .reads import EntryReads

_PAGE = 1000
#: Characters a task id may hold and still be found by its bytes in any serializer's output.
_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:@+")


class RedisLookup:
    """Entries of one Redis back-out store by id prefix or task id."""

    def __init__(self, client: redis.Redis, keys: BackoutKeys, reads: EntryReads) -> None:
        self.client = client
        self.keys = keys
        self.reads = reads

    def with_prefix(self, prefix: str, limit: int = 20) -> builtins.list[ParkedTask]:
        """Entries whose id starts with ``prefix`` (at most ``limit``), newest first."""
        if not prefix or any(c in prefix for c in "*?[]\\"):
            return []  # MATCH patterns: a person's prefix is plain text
        found: builtins.list[tuple[str, float]] = []
        with unavailable("back-out store"):
            for member, score in self.client.zscan_iter(
                self.keys.index, match=f"{prefix}*", count=_PAGE
            ):
                found.append((cast(bytes, member).decode(), float(score)))
                if len(found) >= limit:
                    break
            found.sort(key=lambda pair: (pair[1], pair[0]), reverse=True)
            return self.reads.load(found)

    def with_task_id(self, task_id: str, limit: int = 20) -> builtins.list[ParkedTask]:
        """Entries of Celery task ``task_id`` (at most ``limit``), newest first."""
        if not task_id:
            return []
        needle = task_id.encode() if set(task_id) <= _PLAIN else b""
        candidates: builtins.list[str] = []
        with unavailable("back-out store"):
            for field, data in self.client.hscan_iter(self.keys.entries, count=_PAGE):
                if needle in cast(bytes, data):
                    candidates.append(cast(bytes, field).decode())
            scores = self.client.zmscore(self.keys.index, candidates) if candidates else []
            pairs = [
                (i, float(s)) for i, s in zip(candidates, scores, strict=True) if s is not None
            ]
            pairs.sort(key=lambda pair: (pair[1], pair[0]), reverse=True)
            matches = [e for e in self.reads.load(pairs) if e.task_id == task_id]
        return matches[:limit]
