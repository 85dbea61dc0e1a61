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
                                 ``~counted`` covers (see ``reasons.py``)
``{P:backout}:ready:<b>``  zset  entry id -> due_at (lease end while claimed by a drain)
``{P:backout}:dead``       zset  entry id -> time it died (Redis ``TIME``, seconds)
``{P:backout}:inflight``   zset  entry id -> lease end, what is out with a drainer now
``{P:backout}:stats``      hash  monotonic counters for metrics (parks, replays, drains)
``{P:backout}:consumed``   hash  entry id -> parked_at of an entry a drain or a replay published
``{P:backout}:consumed_    zset  entry id -> when it is forgotten (its signed lifetime's end)
until``
``{P:backout}:held:<r>``   zset  entry id -> parked_at, of the entries the last drain to judge
                                 them left parked for a process that can read them, ``<r>``
                                 the reason (``unknown_key``, ``newer_format``)
=========================  ====  ===========================================================

``meta`` is authoritative for status: a claimed (in-flight) entry keeps ``parked`` there and in
``counts`` until the drain acks it (``delete.lua``) or marks it dead (``mark_dead.lua``).
Times are float epoch seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..trust import HELD_CODES


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
    consumed: str
    consumed_until: str

    @classmethod
    def for_prefix(cls, prefix: str) -> BackoutKeys:
        tag = f"{{{prefix}:backout}}"
        names: tuple[str, ...] = ("entries", "index", "meta", "counts", "dead", "inflight")
        names += ("stats", "reasons", "consumed", "consumed_until")
        return cls(tag, *(f"{tag}:{name}" for name in names))

    def ready(self, breaker: str) -> str:
        """Ready set of a breaker's internal name (``NO_BREAKER`` for none)."""
        return f"{self.tag}:ready:{breaker}"

    @property
    def held(self) -> list[str]:
        """The held entries' sets, one per reason of ``HELD_CODES``, in its order."""
        return [f"{self.tag}:held:{code}" for code in HELD_CODES]
