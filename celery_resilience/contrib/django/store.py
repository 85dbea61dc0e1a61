"""The back-out store in a Django database: ``resilience_backout_store = "django"``.

Same contract as the Redis store (``tests/test_backout_store.py`` runs on SQLite and
PostgreSQL). How the Redis store's atomic scripts map onto the ORM:

- ``park`` counts and inserts under a lock row (a ``ResilienceStat`` named ``lock|park``,
  taken by *writing* it: a row lock on PostgreSQL and MySQL, SQLite's write lock at once, so a
  deferred SQLite transaction never has to upgrade a read lock). ``max_entries`` holds under
  concurrency; parks are serialized, as they are in Redis.
- ``claim`` selects due rows ``FOR UPDATE SKIP LOCKED`` where the database has it: two drainers
  never claim the same row. Elsewhere (SQLite) claims take the ``lock|claim`` row first.
- Everything else is one UPDATE or DELETE statement.

The drain's side (claim, ack, release) is in ``claims.py``.

Time: the database's clock can't be read portably through the ORM, so leases, due times and
``dead_ttl`` use this process's ``time.time()``; keep the clocks of hosts that drain in sync.
"""

from __future__ import annotations

import builtins
import time
from typing import TYPE_CHECKING, Any, cast

from django.db import IntegrityError, transaction
from django.db.models import F

from ...errors import ConfigurationError
from ...parked.codec import Codec
from ...parked.entry import UNDECODABLE_TASK, ParkedTask, Reason, Status
from ...parked.store import (
    ANY,
    Filter,
    Meta,
    StoreFull,
    breaker_key,
    check_dead_reason,
    check_page,
    read_entry,
)
from .claims import COLUMNS, DjangoClaims, reachable

if TYPE_CHECKING:
    from ...runtime import Runtime

APP = "celery_resilience.contrib.django"
#: Stat rows with this prefix are locks, not counters: ``stats()`` leaves them out.
LOCK_PREFIX = "lock|"


class DjangoBackoutStore(DjangoClaims):
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
        from .models import ParkedTaskRecord, ResilienceStat

        self.codec = codec or Codec(serializer)
        self.serializer = self.codec.serializer
        self.max_entries = max_entries
        self.dead_ttl = dead_ttl
        self.using = using
        self._model = ParkedTaskRecord
        self._stat = ResilienceStat

    def _rows(self) -> Any:
        return self._model.objects.using(self.using)

    def _filtered(self, where: Filter) -> Any:
        wanted = {"breaker": where.breaker, "status": where.status, "reason": where.reason}
        return self._rows().filter(**{k: v for k, v in wanted.items() if v is not None})

    # -- writes ---------------------------------------------------------------------------

    def park(self, entry: ParkedTask) -> None:
        data = self.codec.encode(entry)
        meta = Meta.of(entry)
        with reachable(), transaction.atomic(using=self.using):
            self._lock("park")
            rows = self._rows()
            if rows.filter(pk=entry.id).exists():
                return
            if rows.count() >= self.max_entries:
                raise StoreFull(self.max_entries, entry.id)
            rows.create(
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
            self._add(f"parked|{meta.breaker}|{meta.reason}", 1)

    def _lock(self, name: str) -> None:
        """Hold the lock row ``name`` until the transaction ends (see the module docstring)."""
        self._add(LOCK_PREFIX + name, 1)

    def _add(self, name: str, amount: float) -> None:
        """Add to a counter row (UPDATE first: that write is also what locks the row)."""
        stats = self._stat.objects.using(self.using)
        if stats.filter(name=name).update(value=F("value") + amount):
            return
        try:
            with transaction.atomic(using=self.using):
                stats.create(name=name, value=amount)
        except IntegrityError:  # made meanwhile by another process: add to that one
            stats.filter(name=name).update(value=F("value") + amount)

    def stats(self) -> dict[str, float]:
        with reachable():
            rows = self._stat.objects.using(self.using).values_list("name", "value")
            return {n: float(v) for n, v in rows if not n.startswith(LOCK_PREFIX)}

    def bump(self, counters: dict[str, float]) -> None:
        if not counters:
            return
        with reachable(), transaction.atomic(using=self.using):
            for name, amount in counters.items():
                self._add(name, amount)

    def delete(self, entry_id: str) -> bool:
        with reachable():
            return bool(self._rows().filter(pk=entry_id).delete()[0])

    def purge(self, where: Filter = ANY) -> int:
        with reachable():
            return int(self._filtered(where).delete()[0])

    def mark_dead(self, entry_id: str, dead_reason: str) -> bool:
        check_dead_reason(dead_reason)
        with reachable():
            changed = (
                self._rows()
                .filter(pk=entry_id, status="parked")
                .update(
                    status="dead", dead_reason=dead_reason, died_at=time.time(), lease_until=None
                )
            )
        return bool(changed)

    def expire_dead(self) -> int:
        if self.dead_ttl is None:
            return 0
        cutoff = time.time() - self.dead_ttl
        with reachable():
            return int(self._rows().filter(status="dead", died_at__lte=cutoff).delete()[0])

    # -- reads ----------------------------------------------------------------------------

    def get(self, entry_id: str) -> ParkedTask | None:
        with reachable():
            row = self._rows().filter(pk=entry_id).values_list(*COLUMNS).first()
        return None if row is None else self._read(row)

    def count(self, where: Filter = ANY) -> int:
        with reachable():
            return int(self._filtered(where).count())

    def breakers(self) -> set[str]:
        with reachable():
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

    def payloads(self, offset: int, limit: int) -> builtins.list[tuple[str, bytes]]:
        check_page(limit, offset)
        rows = self._rows().order_by("-parked_at", "-id").values_list("id", "payload")
        with reachable():
            return [(i, bytes(p)) for i, p in rows[offset : offset + limit]]

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
        if self._rows().filter(pk=entry_id).update(payload=data):
            return
        when = time.time() if parked_at is None else parked_at
        self._rows().create(
            id=entry_id,
            task_name=UNDECODABLE_TASK,  # the columns are only for filters: unknown here
            task_id="",
            breaker=breaker_key(breaker),
            reason=reason,
            status="parked",
            parked_at=when,
            due_at=when,
            payload=data,
        )


def make_store(runtime: Runtime) -> DjangoBackoutStore:
    """The store of ``resilience_backout_store = "django"``, on the ``default`` database."""
    config = runtime.config
    return DjangoBackoutStore(
        codec=Codec.of(config),
        max_entries=config.backout_max_entries,
        dead_ttl=config.dead_ttl,
    )
