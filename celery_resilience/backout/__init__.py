"""The back-out store: tasks that can't run now, kept durably until a drain replays them."""

from __future__ import annotations

from ..errors import StoreFull, UndecodableEntry
from .codec import Codec, decode, encode
from .entry import REASONS, STATUSES, ParkedTask, Reason, Status, cut_traceback
from .memory import MemoryBackoutStore
from .redis import BackoutKeys, RedisBackoutStore
from .store import ANY, NO_BREAKER, BackoutStore, Filter

__all__ = [
    "ANY",
    "NO_BREAKER",
    "REASONS",
    "STATUSES",
    "BackoutKeys",
    "BackoutStore",
    "Codec",
    "Filter",
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
