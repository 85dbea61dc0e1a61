"""The drain: parked work brought back (the run, a batch's publishing, the lock, the gate and
pace, the queue room, what republishing an entry checks) and the replay on demand that shares
its lock. One batch flows one way: claim, check each entry, publish, then ack, give back or
mark dead in one pass."""

from .drainer import Drainer
from .report import DrainReport

__all__ = ["DrainReport", "Drainer"]
