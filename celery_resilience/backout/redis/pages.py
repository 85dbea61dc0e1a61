"""Filtered pages and purges of the Redis back-out store, at millions of entries.

A filter is answered from the smallest sets that hold every match (``sources``): a breaker's
ready set holds its parked entries (claimed and held ones included), ``dead`` every dead one;
only a filter by reason alone needs the whole ``index``. Meta is still read for every
candidate and decides, so a set that holds more than the matches is never wrong, only slower.

- ``list``: when the sources hold at most ``SMALL`` ids, they are read whole and sorted by
  ``parked_at`` (``ZMSCORE`` of the index); else the index is walked newest first, a page of
  ``_PAGE`` at a time, and the walk ends as soon as the counters say every match was seen
  (a filter that matches nothing costs nothing; by reason, once the reason counters are
  complete).
- ``purge``: the sources are scanned (``ZSCAN``, which returns every member present for the
  whole scan while we delete as we go) and removed ``_PAGE`` at a time, each batch one
  ``delete.lua``: no script holds Redis for more than a few milliseconds.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from typing import cast

import redis

from ...redis_io import unavailable
from ..entry import ParkedTask
from ..store import ANY, OLDEST_SCAN, Filter, check_page, count_in
from .keys import BackoutKeys
from .reads import EntryReads
from .reasons import ReasonCounts, total_of

#: Ids per batch: each command and each script handles at most this many.
_PAGE = 500
#: Sources this small are read whole and sorted, rather than walking the index.
SMALL = 10_000


class RedisPages:
    """Filtered pages and purges of one Redis back-out store."""

    def __init__(
        self,
        client: redis.Redis,
        keys: BackoutKeys,
        reads: EntryReads,
        reasons: ReasonCounts,
        delete_ids: Callable[[Sequence[str]], int],
    ) -> None:
        self.client = client
        self.keys = keys
        self.reads = reads
        self.reasons = reasons
        #: The store's own delete (``delete.lua`` with each entry's breaker).
        self.delete_ids = delete_ids

    def sources(self, where: Filter) -> builtins.list[str]:
        """The keys whose members include every entry ``where`` matches (see the docstring)."""
        k = self.keys
        if where.status == "dead":
            return [k.dead]
        # ``inflight`` too: a drain of an older release took claimed entries out of ``ready``.
        if where.breaker is not None:
            parked = [k.ready(where.breaker), k.inflight]
            return parked if where.status == "parked" else [*parked, k.dead]
        if where.status == "parked":
            names = {c.partition("|")[2] for c, n in self.reads.counters().items() if n > 0}
            return [*(k.ready(name) for name in sorted(names)), k.inflight]
        return [k.index]

    # -- list -------------------------------------------------------------------------------

    def list(
        self, where: Filter = ANY, limit: int = 100, offset: int = 0
    ) -> builtins.list[ParkedTask]:
        check_page(limit, offset)
        if limit == 0:
            return []
        with unavailable("back-out store"):
            if where == ANY:
                page = self.reads.newest(offset, limit)
                return self.reads.load([(m.decode(), s) for m, s in page])
            total = self._total(where)
            if total is not None and offset >= total:
                return []
            sources = self.sources(where)
            if sources != [self.keys.index] and self._size(sources) <= SMALL:
                return self.reads.load(self._sorted(sources, where)[offset : offset + limit])
            return self.reads.load(self._walk(where, limit, offset, total))

    def _total(self, where: Filter) -> int | None:
        """How many entries match, from counters; ``None`` when they can't say (by reason, in a
        store whose reason counters are not complete: see ``reasons.py``)."""
        if where.reason is None:
            return count_in(self.reads.counters(), where)
        counters = self.reasons.counters()
        return None if counters is None else total_of(counters, where)

    def _size(self, keys: Sequence[str]) -> int:
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.zcard(key)
        return sum(int(n) for n in pipe.execute())

    def _sorted(self, sources: Sequence[str], where: Filter) -> builtins.list[tuple[str, float]]:
        """Every match in ``sources`` (few), newest ``parked_at`` first, as the index orders."""
        members = [cast(builtins.list[bytes], self.client.zrange(key, 0, -1)) for key in sources]
        ids = sorted({m.decode() for each in members for m in each})
        found: builtins.list[tuple[str, float]] = []
        for start in range(0, len(ids), _PAGE):
            chunk = ids[start : start + _PAGE]
            scores = self.client.zmscore(self.keys.index, chunk)
            metas = self.reads.metas(chunk)
            found += [
                (i, s)
                for i, s in zip(chunk, scores, strict=True)
                if s is not None and (m := metas.get(i)) is not None and where.matches(m)
            ]
        found.sort(key=lambda pair: (pair[1], pair[0]), reverse=True)
        return found

    def _walk(
        self, where: Filter, limit: int, offset: int, total: int | None
    ) -> builtins.list[tuple[str, float]]:
        """The index newest first, until the page is full or every match (``total``) was seen."""
        chosen: builtins.list[tuple[str, float]] = []
        seen, start = 0, 0
        while len(chosen) < limit and (total is None or seen < total):
            page = self.reads.newest(start, _PAGE)
            if not page:
                break
            start += _PAGE
            metas = self.reads.metas([m.decode() for m, _ in page])
            for member, score in page:
                meta = metas.get(member.decode())
                if meta is None or not where.matches(meta):
                    continue
                seen += 1
                if seen > offset and len(chosen) < limit:
                    chosen.append((member.decode(), score))
        return chosen

    # -- the oldest parked entry -------------------------------------------------------------

    def oldest_parked(self) -> float | None:
        """The index oldest first, a page at a time, until an entry's meta says ``parked``:
        one page (two round trips) unless dead entries are older than every parked one."""
        with unavailable("back-out store"):
            for start in range(0, OLDEST_SCAN, _PAGE):
                end = start + _PAGE - 1
                page = cast(
                    builtins.list[tuple[bytes, float]],
                    self.client.zrange(self.keys.index, start, end, withscores=True),
                )
                if not page:
                    return None
                metas = self.reads.metas([m.decode() for m, _ in page])
                for member, score in page:
                    meta = metas.get(member.decode())
                    if meta is not None and meta.status == "parked":
                        return float(score)
        return None

    # -- purge ------------------------------------------------------------------------------

    def purge(self, where: Filter = ANY, progress: Callable[[int], None] | None = None) -> int:
        deleted = 0
        with unavailable("back-out store"):
            for source in self.sources(where):
                page: builtins.list[str] = []
                for member, _ in self.client.zscan_iter(source, count=_PAGE):
                    page.append(member.decode())
                    if len(page) >= _PAGE:
                        deleted += self._purge_page(page, where, progress)
                        page = []
                deleted += self._purge_page(page, where, progress)
        return deleted

    def _purge_page(
        self, ids: builtins.list[str], where: Filter, progress: Callable[[int], None] | None
    ) -> int:
        if where != ANY:
            metas = self.reads.metas(ids)
            ids = [i for i in ids if (m := metas.get(i)) and where.matches(m)]
        done = self.delete_ids(ids) if ids else 0
        if progress is not None and done:
            progress(done)
        return done
