"""Raw bytes written into a back-out store, as no codec would write them: a corrupt write, a
forged or altered payload, an entry of an older release. One helper for every backend, so the
stores themselves hold no test-only writer."""

from __future__ import annotations

import time
from typing import Any

from celery_resilience.backout import MemoryBackoutStore, RedisBackoutStore
from celery_resilience.backout.entry import UNDECODABLE_TASK
from celery_resilience.backout.memory import _Record
from celery_resilience.backout.store import Meta, breaker_key


def put_raw(
    store: Any,
    entry_id: str,
    data: bytes,
    *,
    breaker: str | None = None,
    reason: str = "park_on",
    parked_at: float | None = None,
) -> None:
    """Store ``data`` as the payload of ``entry_id`` (replacing an entry's, or as a new parked
    entry of ``breaker`` parked for ``reason`` at ``parked_at``, due then)."""
    meta = Meta(breaker_key(breaker), "parked", reason)  # type: ignore[arg-type]
    if isinstance(store, MemoryBackoutStore):
        with store._lock:
            record = store._records.get(entry_id)
            if record is not None:
                record.data = data
                return
            when = store.clock() if parked_at is None else parked_at
            store._records[entry_id] = _Record(data, meta, when)
        return
    when = time.time() if parked_at is None else parked_at
    if isinstance(store, RedisBackoutStore):
        if store.client.hexists(store.keys.meta, entry_id):
            store.client.hset(store.keys.entries, entry_id, data)
            return
        store._put(entry_id, data, meta, when, when, 2**62)
        return
    from celery_resilience.contrib.django.store import DjangoBackoutStore  # needs Django set up

    assert isinstance(store, DjangoBackoutStore), f"no raw writer for {type(store).__name__}"
    if store._rows().filter(pk=entry_id).update(payload=data):
        return
    store._rows().create(
        id=entry_id,
        task_name=UNDECODABLE_TASK,  # the columns are only for filters: unknown here
        task_id="",
        breaker=meta.breaker,
        reason=reason,
        status="parked",
        parked_at=when,
        due_at=when,
        payload=data,
    )
