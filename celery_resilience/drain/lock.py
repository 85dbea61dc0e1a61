"""One drainer at a time: the lock that the drain and a replay on demand both take.

It lives in the breakers' Redis whatever the store (a database store included), so it is
fleet-wide: a Redis lock with a token and an expiry, renewed by the drain after every batch.
Only the ``memory://`` backend, one process by definition, uses a local lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from redis.exceptions import LockError, RedisError

from ..backout.redis.keys import BackoutKeys
from ..redact import get_logger
from ..redis_io import unavailable
from ..runtime import Runtime

logger = get_logger("celery_resilience.drain")
_local_locks: dict[int, threading.Lock] = {}


@contextmanager
def drain_lock(runtime: Runtime, lease: float, wait: float = 0.0) -> Iterator[Any]:
    """Hold the lock for ``lease`` seconds (waiting up to ``wait``); ``None`` if someone else
    holds it. ``StoreUnavailable`` if Redis can't be asked."""
    if runtime.config.in_memory:
        with _local_lock(id(runtime.backout_store), wait) as local:
            yield local
        return
    name = f"{BackoutKeys.for_prefix(runtime.config.key_prefix).tag}:drain-lock"
    lock = runtime.redis.lock(name, timeout=lease, blocking=wait > 0, blocking_timeout=wait)
    with unavailable("drain lock"):
        acquired = lock.acquire()
    if not acquired:
        yield None
        return
    try:
        yield lock
    finally:
        try:
            lock.release()
        except LockError:  # expired meanwhile: someone else may hold it now; not ours to free
            logger.warning("Drain lock expired before release")
        except RedisError as exc:  # Redis went away: the lock expires by itself
            logger.warning("Drain lock not released (%s); it expires in %.0fs", exc, lease)


@contextmanager
def _local_lock(key: int, wait: float) -> Iterator[threading.Lock | None]:
    local = _local_locks.setdefault(key, threading.Lock())
    acquired = local.acquire(timeout=wait) if wait > 0 else local.acquire(blocking=False)
    if not acquired:
        yield None
        return
    try:
        yield local
    finally:
        local.release()
