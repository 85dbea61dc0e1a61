"""The Redis back-out store's key layout.

Every key shares the hash tag ``{<P>:backout}`` (``P`` = the key prefix), so each script's keys
live in one Redis Cluster slot. ``<b>`` is a breaker name, ``-`` for entries without a breaker.

=========================  ====  ===========================================================
key                        type  holds
=========================  ====  ===========================================================
``{P:backout}:entries``    hash  entry id -> encoded ``ParkedTask`` (see ``codec.py``)
``{P:backout}:index``      zset  entry id -> parked_at, every entry (newest-first listing)
``{P:backout}:meta``       hash  entry id -> ``status|reason|dead_reason|breaker``
``{P:backout}:counts``     hash  ``status|<b>`` -> number of entries (O(1) count)
``{P:backout}:reasons``    hash  ``status|reason|<b>`` -> number of entries, of the entries
                                 ``~counted`` covers (see ``redis_reasons.py``)
``{P:backout}:ready:<b>``  zset  entry id -> due_at (lease end while claimed by a drain)
``{P:backout}:dead``       zset  entry id -> time it died (Redis ``TIME``, seconds)
``{P:backout}:inflight``   zset  entry id -> lease end, what is out with a drainer now
``{P:backout}:stats``      hash  monotonic counters for metrics (parks, replays, drains)
=========================  ====  ===========================================================

``meta`` is authoritative for status: a claimed (in-flight) entry keeps ``parked`` there and in
``counts`` until the drain acks it (``delete.lua``) or marks it dead (``mark_dead.lua``).
Times are float epoch seconds.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BackoutKeys:
    """Names of the store's keys (the drain's scripts take theirs from here too)."""

    tag: str
    entries: str
    index: str
    meta: str
    counts: str
    dead: str
    inflight: str
    stats: str
    reasons: str

    @classmethod
    def for_prefix(cls, prefix: str) -> BackoutKeys:
        tag = f"{{{prefix}:backout}}"
        names = ("entries", "index", "meta", "counts", "dead", "inflight", "stats", "reasons")
        return cls(tag, *(f"{tag}:{name}" for name in names))

    def ready(self, breaker: str) -> str:
        """Ready set of a breaker's internal name (``NO_BREAKER`` for none)."""
        return f"{self.tag}:ready:{breaker}"
