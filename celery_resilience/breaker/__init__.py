"""Circuit breakers shared by every worker: the pure model, its stores, and the facade."""

from .breaker import Breaker
from .memory import MemoryBreakerStore
from .permit import Permit
from .redis import RedisBreakerStore
from .store import BreakerStore

__all__ = ["Breaker", "BreakerStore", "MemoryBreakerStore", "Permit", "RedisBreakerStore"]
