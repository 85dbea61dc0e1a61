"""What one process knows of its breakers between round trips.

A closed breaker admits a call without asking Redis, as long as the process is sure it would
have heard of any change: its watch (``BreakerStore.watch``) is live, what it knows was learnt
during the current live period, and a script's reply taught it at most ``MAX_VIEW_AGE`` seconds
ago. Versions order what is heard: a published change and a script's reply travel on different
connections, and the higher version wins, within one epoch (incarnation) of the breaker's stored
state. A view is born only from a script's reply, which comes from the process's own keys; a
published change updates it only if it names the same epoch (or the view has none: it was learnt
before the hash existed), and one naming another epoch (the state was deleted and made again, or
the change is not about these keys at all) drops the view.

The age bound is what holds whatever happened to the feed or the keys: a subscription silent
without an error, a hash restored from a backup under a version already seen. Past it the next
call asks Redis (under steady traffic the once-a-second flush of successes answers first, so it
costs nothing more). Anything else (no view yet, a watch not yet or no longer live, a breaker not
closed) sends the call to Redis too, whose reply teaches the view again.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .store import BreakerStore, Watch
from .types import State

#: States in which a permit is always granted: the ones a process may answer alone.
ADMITTING: frozenset[State] = frozenset({"closed", "forced_closed"})
#: The generation of a watch that is not live.
NOT_LIVE = -1
#: Seconds after a script's reply taught a view during which the process may admit calls on it
#: alone (the staleness bound of docs/guarantees.rst): twice the flush interval of successes, so
#: that under traffic a flush's reply renews it before it runs out.
MAX_VIEW_AGE = 2.0
#: Forks so far in this process's lineage: compared on the hot path instead of ``os.getpid()``.
_forks = 0


def _forked() -> None:
    global _forks  # noqa: PLW0603 - one counter per process, bumped in a child
    _forks += 1


os.register_at_fork(after_in_child=_forked)


def forks() -> int:
    """How many forks made this process (0 in the process that started)."""
    return _forks


@dataclass(slots=True)
class View:
    version: int
    state: State
    streak: bool  # consecutive failures > 0: a success is recorded at once, it ends the streak
    generation: int  # the live period it was learnt in
    epoch: str  # the incarnation of the stored state that ``version`` counts in
    learnt: float  # time.monotonic() of the script reply that last confirmed it


class Views:
    """The views of one process's breakers, kept current by one watch of their store."""

    def __init__(self, store: Callable[[], BreakerStore]) -> None:
        self._store = store
        self._views: dict[str, View] = {}
        # Re-entrant: a store may call back (``on_live``) from inside ``watch``.
        self._lock = threading.RLock()
        self._watch: Watch | None = None
        self._pid = -1
        self._forks = -1
        self._periods = 0  # live periods so far: each one a generation
        #: The current generation while the watch is live, else ``NOT_LIVE``.
        self.generation = NOT_LIVE

    # -- the hot path ---------------------------------------------------------------------------
    def admits(self, name: str) -> View | None:
        """The view if it alone may admit a call (a closed breaker, known for sure)."""
        view = self._views.get(name)
        if view is None or view.generation != self.generation or view.state not in ADMITTING:
            return None
        if self._forks != _forks:  # a forked child: nothing of the parent's holds
            return None
        if time.monotonic() - view.learnt > MAX_VIEW_AGE:
            return None
        return view

    def known(self, name: str) -> View | None:
        """The view, whatever its state, if the process knows it for sure (a live watch, and a
        reply that confirmed it at most ``MAX_VIEW_AGE`` seconds ago)."""
        view = self._views.get(name)
        if view is None or view.generation != self.generation or self._forks != _forks:
            return None
        if time.monotonic() - view.learnt > MAX_VIEW_AGE:
            return None
        return view

    # -- learning -------------------------------------------------------------------------------
    def start(self) -> int:
        """Make sure this process watches (after a fork too, and after its watch's thread died
        for good); the generation to learn under."""
        if self._pid != os.getpid() or not _alive(self._watch):
            with self._lock:
                if self._pid != os.getpid() or not _alive(self._watch):
                    if self._watch is not None:
                        self._watch.close()
                    self._views.clear()
                    self.generation = NOT_LIVE
                    self._pid, self._forks = os.getpid(), _forks
                    self._watch = self._store().watch(self._heard, self._live, self._lost)
        return self.generation

    def learn(
        self, name: str, version: int, state: State, streak: bool, epoch: str, generation: int
    ) -> None:
        """A script's reply, to a request sent during ``generation`` (see :meth:`start`)."""
        if generation == NOT_LIVE:
            return
        with self._lock:
            if generation != self.generation:
                return  # the watch was lost meanwhile: a change may have been missed
            known = self._views.get(name)
            now = time.monotonic()
            if (
                known is None
                or known.generation != generation
                or known.epoch != epoch  # replies come from this process's own keys
                or now - known.learnt > MAX_VIEW_AGE  # too old to order anything
                or version >= known.version
            ):
                self._views[name] = View(version, state, streak, generation, epoch, now)

    def forget(self) -> None:
        """Redis did not answer: trust nothing until the watch says it is live again."""
        with self._lock:
            self._views.clear()

    def close(self) -> None:
        with self._lock:
            if self._watch is not None:
                self._watch.close()
            self._watch, self._pid, self._forks, self.generation = None, -1, -1, NOT_LIVE
            self._views.clear()

    # -- the watch's callbacks ------------------------------------------------------------------
    def _heard(self, name: str, version: int, state: State, streak: bool, epoch: str) -> None:
        with self._lock:
            known = self._views.get(name)
            if known is None or self.generation == NOT_LIVE:
                return  # nothing to check the change against: the next call asks Redis
            # A view without an epoch was learnt before the hash existed: whatever made it since
            # counts its versions from 0 too, so the change is newer. Any other epoch is not
            # the state this process knew (recreated, or not its keys at all): ask Redis again.
            if known.generation != self.generation or known.epoch not in ("", epoch):
                del self._views[name]
            elif version >= known.version:
                # Confirms nothing about the age: only a reply renews ``learnt``.
                self._views[name] = View(
                    version, state, streak, known.generation, epoch, known.learnt
                )

    def _live(self) -> None:
        with self._lock:
            self._periods += 1
            self.generation = self._periods

    def _lost(self) -> None:
        with self._lock:
            self.generation = NOT_LIVE
            self._views.clear()


def _alive(watch: Watch | None) -> bool:
    """A watch whose thread ended for good (if it has one) is no watch."""
    if watch is None:
        return False
    is_alive = getattr(watch, "is_alive", None)
    return is_alive is None or bool(is_alive())
