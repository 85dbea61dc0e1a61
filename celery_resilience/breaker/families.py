"""What one process knows of a family of derived breakers (``<base>:<key>``, named at call time).

A webhook sender names a breaker per host: thousands of them, most called a few times an hour,
so a view per breaker (``knowledge.py``) would be stale at nearly every call. The family is known as
one: its version, which every view change of a member bumps in the script that made it, and the
members that are not closed without a streak (``troubled``). A process that has heard every
change since a reply confirmed the version knows that any other member is closed: it admits a
call on it without a round trip. The same rules as a view hold: learnt while the watch is live,
confirmed by a script's reply at most ``MAX_KNOWLEDGE_AGE`` seconds ago, within one epoch of the
family's hash. Changes are applied in version order, one after the other; a gap (a change not
heard) or another epoch drops the knowledge, and the next call asks Redis again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .store import FamilyReport
from .types import Family, State


@dataclass(slots=True)
class KnownFamily:
    """A family as this process knows it."""

    version: int
    epoch: str
    generation: int  # the live period of the watch it was learnt in
    learnt: float  # time.monotonic() of the reply that last confirmed the version
    troubled: set[str] = field(default_factory=set)
    #: Successes on its members that this process held back (sent with the next refresh).
    deferred: int = 0

    @classmethod
    def of(cls, report: FamilyReport, generation: int, now: float) -> KnownFamily | None:
        """From a store's report; ``None`` when too many members are troubled to list."""
        if not report.complete:
            return None
        return cls(report.version, report.epoch, generation, now, set(report.names))

    def heard(self, family: Family, name: str, state: State, streak: bool) -> bool:
        """Apply a published change of member ``name``; ``False`` if the knowledge no longer
        holds (a change was missed, or the family's hash is another incarnation)."""
        version, epoch = family
        if epoch != self.epoch and not (self.epoch == "" and self.version == 0):
            return False
        if version <= self.version:
            return True  # already in what a reply taught
        if version != self.version + 1:
            return False
        self.version, self.epoch = version, epoch
        if streak or state not in ("closed", "forced_closed"):
            self.troubled.add(name)
        else:
            self.troubled.discard(name)
        return True

    def confirms(self, family: Family) -> bool:
        """Whether a reply's (version, epoch) is what this process knows: nothing missed."""
        return family == (self.version, self.epoch)

    def contradicts(self, family: Family) -> bool:
        """Whether a reply shows another incarnation of the family (its hash made again)."""
        return family[1] != self.epoch and not (self.epoch == "" and self.version == 0)
