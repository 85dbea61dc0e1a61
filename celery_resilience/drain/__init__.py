"""The drain: parked work brought back (the run and its passes, a batch's publishing, the lock,
the gate, the pace's rules and their store, the queue room, what republishing an entry checks)
and the replay on demand that shares its lock. One batch flows one way: claim, check each
entry, publish, ack, mark dead, then give back what was not replayed, in one call at the
batch's end."""

from .drainer import Drainer
from .report import DrainReport

__all__ = ["DrainReport", "Drainer"]
