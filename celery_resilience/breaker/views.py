"""What one process knows of its breakers between round trips.

A closed breaker admits a call without asking Redis, as long as the process is sure it would
have heard of any change: its watch (``BreakerStore.watch``) is live, and what it knows was
learnt during the current live period (from a published change, or from a script's reply to a
request sent while the watch was live). Versions order what is heard: a published change and a
script's reply travel on different connections, and the higher version wins.

Anything else (no view yet, a watch not yet or no longer live, a breaker not closed) sends the
call to Redis, whose reply teaches the view again.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

from .store import BreakerStore, Watch
from .types import State

#: States in which a permit is always granted: the ones a process may answer alone.
ADMITTING: frozenset[State] = frozenset({"closed", "forced_closed"})
#: The generation of a watch that is not live.
NOT_LIVE = -1
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
        return view

    def known(self, name: str) -> View | None:
        """The view, whatever its state, if the process knows it for sure (a live watch)."""
        view = self._views.get(name)
        if view is None or view.generation != self.generation or self._forks != _forks:
            return None
        return view

    # -- learning -------------------------------------------------------------------------------
    def start(self) -> int:
        """Make sure this process watches (after a fork too); the generation to learn under."""
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    self._views.clear()
                    self.generation = NOT_LIVE
                    self._pid, self._forks = os.getpid(), _forks
                    self._watch = self._store().watch(self._heard, self._live, self._lost)
        return self.generation

    def learn(self, name: str, version: int, state: State, streak: bool, generation: int) -> None:
        """A script's reply, to a request sent during ``generation`` (see :meth:`start`)."""
        if generation == NOT_LIVE:
            return
        with self._lock:
            if generation != self.generation:
                return  # the watch was lost meanwhile: a change may have been missed
            self._set(name, version, state, streak)

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
    def _heard(self, name: str, version: int, state: State, streak: bool) -> None:
        with self._lock:
            if self.generation != NOT_LIVE:
                self._set(name, version, state, streak)

    def _live(self) -> None:
        with self._lock:
            self._periods += 1
            self.generation = self._periods

    def _lost(self) -> None:
        with self._lock:
            self.generation = NOT_LIVE
            self._views.clear()

    def _set(self, name: str, version: int, state: State, streak: bool) -> None:
        known = self._views.get(name)
        if known is None or known.generation != self.generation or version >= known.version:
            self._views[name] = View(version, state, streak, self.generation)
