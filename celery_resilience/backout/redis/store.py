"""``RedisBackoutStore``: a payload hash plus small indexes, changed only by Lua scripts.

The key layout is in ``keys.py``. The store is made of parts with their own state and
scripts, given what they need: filtered pages and purges (``pages.py``), counts by reason
(``reasons.py``), entries by id prefix or task id (``lookup.py``), tallies that read more than
counters (``tallies.py``), and the reads they share with it (``reads.py``). A claimed entry
stays in its ready set with its score moved to the lease's end (``claim.lua``): if the drainer
dies before it acks, it is due again then.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from typing import cast

import redis

from ...errors import ConfigurationError, NotReplicated, StoreFull
from ...redis_io import call_replicated, load_script, redis_time, unavailable
from ..codec import Codec
from ..entry import ParkedTask
from ..lifetime import Consumed
from ..reading import read_entry
from ..store import (
    ANY,
    NO_BREAKER,
    FamilyOf,
    Filter,
    Meta,
    check_dead_reason,
    check_page,
    count_in,
    counter_scope,
    no_family,
    on_demand_only,
    tally_of,
)
from ..trust import HELD_CODES
from .keys import BackoutKeys
from .lookup import RedisLookup
from .pages import RedisPages
from .reads import EntryReads
from .reasons import BACKFILL_BATCH, ReasonCounts
from .tallies import RedisTallies

__all__ = ["RedisBackoutStore"]

_PAGE = 500
_RETRIES = 3
#: Remembered entries whose time is up that an ack forgets, beyond as many as it remembers.
FORGET = 500


class RedisBackoutStore:
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
        #: Breakers named at call time count under their base (``counter_scope``).
        self.family_of: FamilyOf = no_family
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
        self._give_back = load_script(client, __package__, "give_back")
        self._rewrite = load_script(client, __package__, "rewrite")
        self._revive = load_script(client, __package__, "revive")
        #: Reads the store and its pages share; counts by reason; filtered pages and purges.
        self.reads = EntryReads(client, self.keys, self.codec)
        self.reasons = ReasonCounts(client, self.keys)
        self.pages = RedisPages(client, self.keys, self.reads, self.reasons, self._delete_ids)
        self.lookup = RedisLookup(client, self.keys, self.reads)
        self.tallies = RedisTallies(client, self.keys, self.reads)

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
        keys, argv = self.park_call(entry_id, data, meta, parked_at, due_at, limit)
        if self.replicas:
            wait = self.replicas, self.replicas_timeout
            return int(call_replicated(self.client, self._park, keys, argv, *wait))
        return int(self._park(keys, argv))

    def park_call(
        self, entry_id: str, data: bytes, meta: Meta, parked_at: float, due_at: float, limit: int
    ) -> tuple[list[str], list[str | bytes | int]]:
        """KEYS and ARGV of ``park.lua`` for one entry (the benchmark pipelines them)."""
        k = self.keys
        keys = [k.entries, k.index, k.meta, k.counts, k.ready(meta.breaker), k.dead, k.stats]
        due = "+inf" if on_demand_only(meta.reason) else repr(due_at)  # in its ready set, never due
        argv: list[str | bytes | int] = [entry_id, data, meta.encode(), meta.counter]
        stat = f"parked|{counter_scope(meta.breaker, self.family_of)}|{meta.reason}"
        argv += [repr(parked_at), due, limit, meta.status, stat]
        return [*keys, k.reasons], [*argv, meta.reason_counter]

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

    def _delete_ids(
        self, ids: Sequence[str], breaker: str | None = None, consumed: Sequence[Consumed] = ()
    ) -> int:
        """Delete ``ids`` with ``delete.lua``, which needs each one's breaker (keys in KEYS):
        ``breaker`` when the caller knows it (a drain's ack), else read from meta first."""
        return self._delete_calls(ids, breaker, None)[0]

    def _delete_calls(
        self, ids: Sequence[str], breaker: str | None, consumed: Sequence[Consumed] | None
    ) -> tuple[int, int]:
        """``delete.lua`` until every id's breaker was right; with ``consumed`` (an ack: a list,
        maybe empty), its first call remembers them and forgets at least as many entries whose
        time is up. (deleted, forgotten)."""
        deleted = forgotten = 0
        k = self.keys
        first = True
        for _ in range(_RETRIES):
            ack = consumed is not None and first
            if not ids and not ack:
                break
            if breaker is not None:
                known = dict.fromkeys(ids, breaker)
                breaker = None  # a mismatch found below is read from meta on the next round
            else:
                known = {i: m.breaker for i, m in self.reads.metas(ids).items()}
            keys = [k.entries, k.index, k.meta, k.counts, k.dead, k.inflight, k.reasons, *k.held]
            argv: list[str | int | float] = [-1, 0]
            if ack:
                remembered = consumed or ()
                keys += [k.consumed, k.consumed_until]
                argv = [len(remembered), FORGET + len(remembered)]
                for c in remembered:
                    argv += [c.entry_id, repr(c.parked_at), repr(c.until)]
            ready: dict[str, int] = {}
            for entry_id in ids:
                name = known.get(entry_id)
                position = ready.setdefault(name or NO_BREAKER, len(keys) + 1 + len(ready))
                argv += [entry_id, name or "", position]
            keys += [k.ready(b) for b in ready]
            gone, *results = self._delete(keys, argv)
            forgotten += int(gone)
            deleted += sum(1 for r in results if r == 1)
            ids = [i for i, r in zip(ids, results, strict=True) if r == -1]
            first = False
        return deleted, forgotten

    def mark_dead(self, entry_id: str, dead_reason: str) -> bool:
        check_dead_reason(dead_reason)
        k = self.keys
        with unavailable("back-out store"):
            for _ in range(_RETRIES):
                meta = self.reads.metas([entry_id]).get(entry_id)
                if meta is None:
                    return False
                keys = [k.meta, k.counts, k.dead, k.inflight, k.ready(meta.breaker)]
                result = self._mark_dead(
                    [*keys, k.reasons, k.index, *k.held], [entry_id, dead_reason, meta.breaker]
                )
                if result != -1:
                    return bool(result == 1)
        return False

    def revive(self, entry_id: str, dead_reason: str, due_at: float) -> bool:
        k = self.keys
        with unavailable("back-out store"):
            for _ in range(_RETRIES):
                meta = self.reads.metas([entry_id]).get(entry_id)
                if meta is None:
                    return False
                due = "+inf" if on_demand_only(meta.reason) else repr(due_at)
                keys = [k.meta, k.counts, k.dead, k.ready(meta.breaker), k.reasons, k.index]
                result = self._revive(keys, [entry_id, dead_reason, meta.breaker, due])
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
                        [k.entries, k.index, k.meta, k.counts, k.dead, k.reasons],
                        [self.dead_ttl, _PAGE],
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

    def ack(self, breaker: str, entry_ids: Sequence[str], consumed: Sequence[Consumed] = ()) -> int:
        """Remove entries of ``breaker`` that were published (the end of a claim), remembering
        ``consumed`` in the same atomic step: an ack lost is neither (at-least-once)."""
        with unavailable("back-out store"):
            return self._delete_calls(entry_ids, breaker, consumed)[0]

    def forget_consumed(self) -> int:
        with unavailable("back-out store"):
            forgotten = 0
            while True:
                gone = self._delete_calls((), None, ())[1]
                forgotten += gone
                if gone < FORGET:
                    return forgotten

    def consumed(self, entry_ids: Sequence[str]) -> dict[str, float]:
        if not entry_ids:
            return {}
        with unavailable("back-out store"):
            found = cast(list[bytes | None], self.client.hmget(self.keys.consumed, list(entry_ids)))
        return {i: float(v) for i, v in zip(entry_ids, found, strict=True) if v is not None}

    def give_back(self, breaker: str, entry_ids: Sequence[str], due_at: float) -> int:
        """Give claimed entries back unreplayed, due again at ``due_at`` (their publish failed)."""
        return self._give_back_ids(breaker, entry_ids, due_at, None)

    def release(self, breaker: str, entry_ids: Sequence[str], due_at: float) -> int:
        """Deprecated alias of :meth:`give_back`: ``release`` names a permit's end (see the
        design page's glossary)."""
        return self.give_back(breaker, entry_ids, due_at)

    def hold(self, breaker: str, entry_ids: Sequence[str], code: str, due_at: float) -> int:
        return self._give_back_ids(breaker, entry_ids, due_at, code)

    def _give_back_ids(
        self, breaker: str, entry_ids: Sequence[str], due_at: float, held: str | None
    ) -> int:
        if not entry_ids:
            return 0
        k = self.keys
        into = 0 if held is None else 4 + HELD_CODES.index(held)
        with unavailable("back-out store"):
            keys = [k.ready(breaker), k.inflight, k.index, *k.held]
            return int(self._give_back(keys, [repr(due_at), into, *entry_ids]))

    def dead_by_reason(self) -> dict[str, int]:
        return self.tallies.dead_by_reason()

    def held_entries(self) -> dict[str, tuple[int, float]]:
        return self.tallies.held_entries()

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

    def entries(self, entry_ids: Sequence[str]) -> builtins.list[ParkedTask]:
        if not entry_ids:
            return []
        with unavailable("back-out store"):
            scores = self.client.zmscore(self.keys.index, list(entry_ids))
            return self.reads.load([(i, s or 0.0) for i, s in zip(entry_ids, scores, strict=True)])

    def list(
        self, where: Filter = ANY, limit: int = 100, offset: int = 0
    ) -> builtins.list[ParkedTask]:
        return self.pages.list(where, limit, offset)

    def purge(self, where: Filter = ANY, progress: Callable[[int], None] | None = None) -> int:
        return self.pages.purge(where, progress)

    def count(self, where: Filter = ANY) -> int:
        if where.reason is None:
            return count_in(self.reads.counters(), where)
        return self.reasons.count(where)

    def reason_counters(self) -> dict[str, int] | None:
        """The ``status|reason|<b>`` counters if they are complete and agree, else ``None``."""
        return self.reasons.counters()

    def backfill_reason_counts(
        self,
        reset: bool = False,
        batch: int = BACKFILL_BATCH,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Count by reason every entry the counters miss (``ReasonCounts.backfill``)."""
        return self.reasons.backfill(reset, batch, progress)

    def with_prefix(self, prefix: str, limit: int = 20) -> builtins.list[ParkedTask]:
        return self.lookup.with_prefix(prefix, limit)

    def with_task_id(self, task_id: str, limit: int = 20) -> builtins.list[ParkedTask]:
        return self.lookup.with_task_id(task_id, limit)

    def oldest_parked(self) -> float | None:
        return self.pages.oldest_parked()

    def breakers(self) -> set[str]:
        return {counter.partition("|")[2] for counter, n in self.reads.counters().items() if n > 0}

    def tally(self) -> dict[tuple[str, str], int]:
        return tally_of(self.reads.counters())

    # -- key rotation (``rekey``): payloads as stored ---------------------------------------

    def payloads(self, after: str, limit: int) -> tuple[str, builtins.list[tuple[str, bytes]]]:
        # HSCAN: a full iteration returns every field present from its start to its end.
        check_page(limit, 0)
        with unavailable("back-out store"):
            cursor, found = cast(
                tuple[int, dict[bytes, bytes]],
                self.client.hscan(self.keys.entries, int(after or 0), count=limit),
            )
        page = [(k.decode(), v) for k, v in found.items()]
        return ("" if int(cursor) == 0 else str(cursor)), page

    def payload(self, entry_id: str) -> bytes | None:
        with unavailable("back-out store"):
            return cast(bytes | None, self.client.hget(self.keys.entries, entry_id))

    def rewrite(self, entry_id: str, old: bytes, new: bytes) -> bool:
        with unavailable("back-out store"):
            return bool(self._rewrite([self.keys.entries], [entry_id, old, new]) == 1)
