"""The earlier path of :class:`BackoutKeys`, an alias kept for the modules that import it from
here (deprecated: the key layout is ``celery_resilience.backout.redis.keys``, and
``celery_resilience.backout.redis`` exports it)."""

from .redis.keys import BackoutKeys

__all__ = ["BackoutKeys"]
