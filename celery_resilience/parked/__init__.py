"""The back-out store: tasks that can't run now, kept durably until a drain replays them."""

from __future__ import annotations

from .entry import (
    REASONS,
    STATUSES,
    ParkedTask,
    Reason,
    Status,
    UndecodableEntry,
    cut_traceback,
    decode,
    encode,
)
from .memory import MemoryBackoutStore
from .redis import BackoutKeys, RedisBackoutStore
from .store import NO_BREAKER, BackoutStore, StoreFull

__all__ = [
    "NO_BREAKER",
    "REASONS",
    "STATUSES",
    "BackoutKeys",
    "BackoutStore",
    "MemoryBackoutStore",
    "ParkedTask",
    "Reason",
    "RedisBackoutStore",
    "Status",
    "StoreFull",
    "UndecodableEntry",
    "cut_traceback",
    "decode",
    "encode",
]
