"""Tallies of the Redis back-out store that read more than counters: dead entries by their dead
reason (a scan of their metadata, for ``check``) and the entries held for another process (the
``held:<reason>`` sets kept by ``give_back.lua``, ``delete.lua`` and ``mark_dead.lua``)."""

from __future__ import annotations

from collections import Counter

import redis

from ...redis_io import unavailable
from ..store import dead_code
from ..trust import HELD_CODES
from .keys import BackoutKeys
from .reads import EntryReads

#: Ids per round trip of a scan.
_PAGE = 500


class RedisTallies:
    """The tallies of one Redis back-out store."""

    def __init__(self, client: redis.Redis, keys: BackoutKeys, reads: EntryReads) -> None:
        self.client = client
        self.keys = keys
        self.reads = reads

    def dead_by_reason(self) -> dict[str, int]:
        found: Counter[str] = Counter()
        page: list[str] = []
        with unavailable("back-out store"):
            for member, _ in self.client.zscan_iter(self.keys.dead, count=_PAGE):
                page.append(member.decode())
                if len(page) >= _PAGE:
                    found.update(dead_code(m.dead_reason) for m in self.reads.metas(page).values())
                    page = []
            found.update(dead_code(m.dead_reason) for m in self.reads.metas(page).values())
        return dict(found)

    def held_entries(self) -> dict[str, tuple[int, float]]:
        with unavailable("back-out store"), self.client.pipeline(transaction=False) as pipe:
            for key in self.keys.held:
                pipe.zcard(key)
                pipe.zrange(key, 0, 0, withscores=True)
            replies = pipe.execute()
        found = {}
        for code, count, oldest in zip(HELD_CODES, replies[::2], replies[1::2], strict=True):
            if count:
                found[code] = (int(count), float(oldest[0][1]) if oldest else 0.0)
        return found
