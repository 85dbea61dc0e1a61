"""The back-out store in Redis: the store (``store.py``), its key layout (``keys.py``), the
parts it is made of, and its Lua scripts (``lua/``, one per atomic operation)."""

from .keys import BackoutKeys
from .store import RedisBackoutStore

__all__ = ["BackoutKeys", "RedisBackoutStore"]
