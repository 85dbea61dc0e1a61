"""Circuit breakers shared by every worker: the pure model, its stores, and the facade."""

from .breaker import Breaker, Permit
from .memory import MemoryBreakerStore
from .redis import RedisBreakerStore
from .store import BreakerStore

__all__ = ["Breaker", "BreakerStore", "MemoryBreakerStore", "Permit", "RedisBreakerStore"]
