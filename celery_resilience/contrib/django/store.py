"""The back-out store in a Django database: ``resilience_backout_store = "django"``.

Same contract as the Redis store (``tests/test_backout_store.py`` runs on SQLite and
PostgreSQL). How the Redis store's atomic scripts map onto the ORM:

- ``park`` inserts with no lock held beyond its own row: the insert is idempotent on the
  primary key (a duplicate is the entry parked already), the full-store check is approximate
  near the limit (``room.py`` says by how much), and its counter is one of ``STAT_SHARDS`` rows
  picked at random (``stat_rows.py``), so concurrent parks never queue behind one hot row (one
  lock row and a count of the table would be exact, and one park at a time across the fleet).
- ``claim`` selects due rows ``FOR UPDATE SKIP LOCKED`` where the database has it: two drainers
  never claim the same row. Elsewhere (SQLite) claims take the ``lock|claim`` row first.
- Everything else is one UPDATE or DELETE statement.

Time: the database's clock can't be read portably through the ORM, so leases, due times and
``dead_ttl`` use this process's ``time.time()``; keep the clocks of hosts that drain in sync.
"""

from __future__ import annotations

import builtins
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from django.db import IntegrityError, transaction

from ...backout.codec import Codec
from ...backout.entry import ParkedTask, Reason, Status
from ...backout.lifetime import Consumed
from ...backout.reading import read_entry
from ...backout.store import (
    ANY,
    FamilyOf,
    Filter,
    Meta,
    check_dead_reason,
    check_page,
    counter_scope,
    dead_code,
    no_family,
)
from ...errors import ConfigurationError, StoreFull
from .consumed import ConsumedRows
from .estimates import distinct_values
from .leases import COLUMNS, Leases
from .room import Room
from .stat_rows import StatRows
from .statements import chunks, reachable

if TYPE_CHECKING:
    from ...runtime import Runtime

APP = "celery_resilience.contrib.django"
#: Rows per statement of a purge: each batch is short, and reported to the progress bar.
PURGE_BATCH = 2000


class DjangoBackoutStore:
    """Parked tasks in the ``ParkedTaskRecord`` table of database ``using``."""

    def __init__(
        self,
        serializer: str = "json",
        codec: Codec | None = None,
        max_entries: int = 1_000_000,
        dead_ttl: float | None = None,
        using: str = "default",
    ) -> None:
        from django.apps import apps

        if not apps.ready or not apps.is_installed(APP):
            raise ConfigurationError(
                f"resilience_backout_store='django' needs {APP!r} in INSTALLED_APPS "
                "and Django set up (django.setup()) before the store is used"
            )
        from .models import ConsumedEntry, ParkedTaskRecord, ResilienceStat

        self.codec = codec or Codec(serializer)
        self.serializer = self.codec.serializer
        self.max_entries = max_entries
        self.dead_ttl = dead_ttl
        #: Breakers named at call time count under their base (``counter_scope``).
        self.family_of: FamilyOf = no_family
        self.using = using
        self._model = ParkedTaskRecord
        #: What drains and replays published (``consumed.py``).
        self._memory = ConsumedRows(ConsumedEntry, using)
        #: Counters and lock rows (``stat_rows.py``).
        self._stats = StatRows(ResilienceStat, using)
        self._room = Room(ParkedTaskRecord, using, max_entries)
        #: Claims under a lease, give-backs, what is held and due (``leases.py``).
        self._leases = Leases(ParkedTaskRecord, using, self._stats)

    def _rows(self) -> Any:
        return self._model.objects.using(self.using)

    def _filtered(self, where: Filter) -> Any:
        wanted = {"breaker": where.breaker, "status": where.status, "reason": where.reason}
        return self._rows().filter(**{k: v for k, v in wanted.items() if v is not None})

    # -- writes ---------------------------------------------------------------------------

    def park(self, entry: ParkedTask) -> None:
        data = self.codec.encode(entry)
        meta = Meta.of(entry)
        with reachable():
            counted = self._room.take()
            if counted is None:
                if self._rows().filter(pk=entry.id).exists():
                    return  # parked already: a no-op, full or not
                raise StoreFull(self.max_entries, entry.id)
            try:
                with transaction.atomic(using=self.using):
                    self._insert(entry, meta, data)
                    scope = counter_scope(meta.breaker, self.family_of)
                    self._stats.add_spread(f"parked|{scope}|{meta.reason}", 1)
            except BaseException as exc:
                if counted:
                    self._room.refund()
                if isinstance(exc, IntegrityError) and self._rows().filter(pk=entry.id).exists():
                    return  # the same id parked already (a redelivered message)
                raise

    def _insert(self, entry: ParkedTask, meta: Meta, data: bytes) -> None:
        self._rows().create(
            id=entry.id,
            task_name=entry.task_name,
            task_id=entry.task_id,
            breaker=meta.breaker,
            reason=meta.reason,
            status=meta.status,
            dead_reason=meta.dead_reason or "",
            parked_at=entry.parked_at,
            due_at=entry.due_at,
            died_at=time.time() if meta.status == "dead" else None,
            payload=data,
        )

    def stats(self) -> dict[str, float]:
        with reachable():
            return self._stats.totals()

    def bump(self, counters: dict[str, float]) -> None:
        if not counters:
            return
        with reachable(), transaction.atomic(using=self.using):
            for name, amount in counters.items():
                self._stats.add(name, amount)

    def delete(self, entry_id: str) -> bool:
        self._room.forget()
        with reachable():
            return bool(self._rows().filter(pk=entry_id).delete()[0])

    def purge(self, where: Filter = ANY, progress: Callable[[int], None] | None = None) -> int:
        """In batches of ``PURGE_BATCH`` rows, each its own statement: no DELETE of millions
        of rows holds its locks for minutes, and an interrupted purge leaves whole rows."""
        self._room.forget()
        removed = 0
        with reachable():
            while True:
                batch = list(self._filtered(where).values_list("pk", flat=True)[:PURGE_BATCH])
                if not batch:
                    return removed
                done = int(self._rows().filter(pk__in=batch).delete()[0])
                removed += done
                if progress is not None:
                    progress(done)

    def mark_dead(self, entry_id: str, dead_reason: str) -> bool:
        check_dead_reason(dead_reason)
        with reachable():
            changed = (
                self._rows()
                .filter(pk=entry_id, status="parked")
                .update(
                    status="dead",
                    dead_reason=dead_reason,
                    died_at=time.time(),
                    lease_until=None,
                    held=None,
                )
            )
        return bool(changed)

    def revive(self, entry_id: str, dead_reason: str, due_at: float) -> bool:
        with reachable():
            changed = (
                self._rows()
                .filter(pk=entry_id, status="dead", dead_reason=dead_reason)
                .update(status="parked", dead_reason="", died_at=None, due_at=due_at)
            )
        return bool(changed)

    def expire_dead(self) -> int:
        if self.dead_ttl is None:
            return 0
        cutoff = time.time() - self.dead_ttl
        self._room.forget()
        with reachable():
            return int(self._rows().filter(status="dead", died_at__lte=cutoff).delete()[0])

    # -- reads ----------------------------------------------------------------------------

    # -- the drain's side: claim under a lease, ack after publish ------------------------
    # A claimed row stays with ``due_at`` and ``lease_until`` at the lease's end: a drainer that
    # dies before it acks leaves it due again then.

    def claim(
        self, breaker: str, limit: int, lease: float, now: float | None = None
    ) -> builtins.list[ParkedTask]:
        """Lease up to ``limit`` due entries of ``breaker`` (internal name) to the caller."""
        return [self._read(row) for row in self._leases.claim(breaker, limit, lease, now)]

    def ack(self, breaker: str, entry_ids: Sequence[str], consumed: Sequence[Consumed] = ()) -> int:
        """Remove entries that were published (the end of a claim), remembering ``consumed`` in
        the same transaction (and forgetting those whose time is up)."""
        self._room.forget()
        with reachable(), transaction.atomic(using=self.using):
            self._memory.remember(consumed)
            return sum(self._rows().filter(pk__in=c).delete()[0] for c in chunks(entry_ids))

    def forget_consumed(self) -> int:
        with reachable():
            return self._memory.forget()

    def consumed(self, entry_ids: Sequence[str]) -> dict[str, float]:
        with reachable():
            return self._memory.of(entry_ids)

    def give_back(self, breaker: str, entry_ids: Sequence[str], due_at: float) -> int:
        """Give claimed entries back unreplayed, due again at ``due_at``; ``breaker`` is not
        needed here."""
        return self._leases.give_back(entry_ids, due_at, None)

    def release(self, breaker: str, entry_ids: Sequence[str], due_at: float) -> int:
        """Deprecated alias of :meth:`give_back`: ``release`` names a permit's end (see the
        design page's glossary)."""
        return self.give_back(breaker, entry_ids, due_at)

    def hold(self, breaker: str, entry_ids: Sequence[str], code: str, due_at: float) -> int:
        return self._leases.give_back(entry_ids, due_at, code)

    def dead_by_reason(self) -> dict[str, int]:
        from django.db.models import Count

        with reachable():
            rows = self._rows().filter(status="dead").values_list("dead_reason")
            found: Counter[str] = Counter()
            for reason, n in rows.annotate(n=Count("pk")).order_by():
                found[dead_code(reason)] += int(n)
        return dict(found)

    def held_entries(self) -> dict[str, tuple[int, float]]:
        return self._leases.held()

    def in_flight(self) -> int:
        return self._leases.in_flight()

    def due(self, breaker: str, now: float | None = None) -> int:
        return self._leases.due(breaker, now)

    def get(self, entry_id: str) -> ParkedTask | None:
        with reachable():
            row = self._rows().filter(pk=entry_id).values_list(*COLUMNS).first()
        return None if row is None else self._read(row)

    def entries(self, entry_ids: Sequence[str]) -> builtins.list[ParkedTask]:
        with reachable():
            rows = {
                row[0]: row
                for chunk in chunks(entry_ids)
                for row in self._rows().filter(pk__in=chunk).values_list(*COLUMNS)
            }
        return [self._read(rows[i]) for i in entry_ids if i in rows]

    def count(self, where: Filter = ANY) -> int:
        with reachable():
            return int(self._filtered(where).count())

    def tally(self) -> dict[tuple[str, str], int]:
        from django.db.models import Count

        with reachable():  # one GROUP BY: breakers with entries are few next to the rows
            rows = self._rows().values_list("breaker", "status").annotate(n=Count("pk"))
            return {(str(b), str(st)): int(n) for b, st, n in rows.order_by()}

    def with_prefix(self, prefix: str, limit: int = 20) -> builtins.list[ParkedTask]:
        if not prefix:
            return []
        return self._newest(self._rows().filter(pk__startswith=prefix), limit)

    def with_task_id(self, task_id: str, limit: int = 20) -> builtins.list[ParkedTask]:
        return self._newest(self._rows().filter(task_id=task_id), limit)

    def _newest(self, rows: Any, limit: int) -> builtins.list[ParkedTask]:
        with reachable():
            found = rows.order_by("-parked_at", "-id").values_list(*COLUMNS)[:limit]
            return [self._read(row) for row in found]

    def oldest_parked(self) -> float | None:
        from django.db.models import Min

        with reachable():
            oldest = self._filtered(Filter(status="parked")).aggregate(oldest=Min("parked_at"))
        return None if oldest["oldest"] is None else float(oldest["oldest"])

    def breakers(self) -> set[str]:
        with reachable():  # every drain pass asks: one index probe a name, not a scan
            names = distinct_values(self._model, self.using, "breaker")
            if names is not None:
                return set(names)
            return set(self._rows().order_by().values_list("breaker", flat=True).distinct())

    def list(
        self, where: Filter = ANY, limit: int = 100, offset: int = 0
    ) -> builtins.list[ParkedTask]:
        check_page(limit, offset)
        if limit == 0:
            return []
        rows = self._filtered(where).order_by("-parked_at", "-id")
        with reachable():
            page = list(rows.values_list(*COLUMNS)[offset : offset + limit])
        return [self._read(row) for row in page]

    def payloads(self, after: str, limit: int) -> tuple[str, builtins.list[tuple[str, bytes]]]:
        # By primary key from the last one seen: ids never change, so no row is passed over.
        check_page(limit, 0)
        rows = self._rows().filter(pk__gt=after).order_by("pk").values_list("id", "payload")
        with reachable():
            page = [(str(i), bytes(p)) for i, p in rows[:limit]]
        return (page[-1][0] if len(page) == limit and limit else ""), page

    def payload(self, entry_id: str) -> bytes | None:
        with reachable():
            found = self._rows().filter(pk=entry_id).values_list("payload", flat=True).first()
        return None if found is None else bytes(found)

    def rewrite(self, entry_id: str, old: bytes, new: bytes) -> bool:
        # One UPDATE that matches the bytes read: a compare-and-set, as rewrite.lua.
        with reachable():
            return bool(self._rows().filter(pk=entry_id, payload=old).update(payload=new))

    def read_record(self, record: Any) -> ParkedTask:
        """The entry of a ``ParkedTaskRecord`` (the admin), a placeholder if undecodable."""
        return self._read(tuple(getattr(record, c) for c in COLUMNS))

    def _read(self, row: tuple[Any, ...]) -> ParkedTask:
        """The entry of a row of ``COLUMNS``."""
        entry_id, payload, breaker, status, reason, dead_reason, parked_at = row
        meta = Meta(breaker, cast(Status, status), cast(Reason, reason), dead_reason or None)
        return read_entry(entry_id, bytes(payload), meta, parked_at, self.codec)


def make_store(runtime: Runtime) -> DjangoBackoutStore:
    """The store of ``resilience_backout_store = "django"``, on the ``default`` database."""
    config = runtime.config
    return DjangoBackoutStore(
        codec=runtime.codec(),
        max_entries=config.backout_max_entries,
        dead_ttl=config.dead_ttl,
    )
