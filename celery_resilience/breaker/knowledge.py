"""What one process knows of its breakers between round trips.

A closed breaker admits a call without asking Redis, as long as the process is sure it would
have heard of any change: its watch (``BreakerStore.watch``) is live, what it knows was learnt
during the current live period, and a script's reply taught it at most ``MAX_KNOWLEDGE_AGE`` seconds
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
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from .families import KnownFamily
from .store import BreakerStore, FamilyReport, Watch
from .types import Change, Decision, Family, State

#: States in which a permit is always granted: the ones a process may answer alone.
ADMITTING: frozenset[State] = frozenset({"closed", "forced_closed"})
#: The generation of a watch that is not live.
NOT_LIVE = -1
#: Seconds after a script's reply taught a view during which the process may admit calls on it
#: alone (the staleness bound of docs/guarantees.rst): twice the flush interval of successes, so
#: that under traffic a flush's reply renews it before it runs out.
MAX_KNOWLEDGE_AGE = 2.0
#: Forks so far in this process's lineage: compared on the hot path instead of ``os.getpid()``.
_forks = 0
#: Every knowledge of this process, for a forked child to give each a lock of its own.
_every: weakref.WeakSet[Knowledge] = weakref.WeakSet()


def _forked() -> None:
    global _forks  # noqa: PLW0603 - one counter per process, bumped in a child
    _forks += 1
    # A fork copies a lock as the parent's threads left it: one the watch thread held while it
    # heard a change would stay held in the child, which has no such thread to release it.
    for knowledge in list(_every):
        knowledge._lock = threading.RLock()


os.register_at_fork(after_in_child=_forked)


def forks() -> int:
    """How many forks made this process (0 in the process that started)."""
    return _forks


@dataclass(slots=True)
class KnownBreaker:
    version: int
    state: State
    streak: bool  # consecutive failures > 0: a success is recorded at once, it ends the streak
    generation: int  # the live period it was learnt in
    epoch: str  # the incarnation of the stored state that ``version`` counts in
    learnt: float  # time.monotonic() of the script reply that last confirmed it


class Knowledge:
    """What one process knows of its breakers, kept current by one watch of their store."""

    def __init__(
        self,
        store: Callable[[], BreakerStore],
        family_of: Callable[[str], str | None] = lambda name: None,
    ) -> None:
        self._store = store
        self._family_of = family_of
        self._breakers: dict[str, KnownBreaker] = {}
        #: Families of derived breakers, by base name (``families.py``): one per declared base.
        self._families: dict[str, KnownFamily] = {}
        self._family_asked: dict[str, float] = {}  # monotonic time of each family's last ask
        # Re-entrant: a store may call back (``on_live``) from inside ``watch``.
        self._lock = threading.RLock()
        _every.add(self)
        self._watch: Watch | None = None
        self._pid = -1
        self._forks = -1
        self._periods = 0  # live periods so far: each one a generation
        #: The current generation while the watch is live, else ``NOT_LIVE``.
        self.generation = NOT_LIVE

    # -- the hot path ---------------------------------------------------------------------------
    def admits(self, name: str) -> KnownBreaker | None:
        """The view if it alone may admit a call (a closed breaker, known for sure)."""
        view = self._breakers.get(name)
        if view is None or view.generation != self.generation or view.state not in ADMITTING:
            return None
        if self._forks != _forks:  # a forked child: nothing of the parent's holds
            return None
        if time.monotonic() - view.learnt > MAX_KNOWLEDGE_AGE:
            return None
        return view

    def known(self, name: str) -> KnownBreaker | None:
        """The view, whatever its state, if the process knows it for sure (a live watch, and a
        reply that confirmed it at most ``MAX_KNOWLEDGE_AGE`` seconds ago)."""
        view = self._breakers.get(name)
        if view is None or view.generation != self.generation or self._forks != _forks:
            return None
        if time.monotonic() - view.learnt > MAX_KNOWLEDGE_AGE:
            return None
        return view

    def admits_member(self, base: str, name: str) -> bool:
        """Whether the process may admit a call on derived breaker ``name`` alone: it knows
        the family of ``base`` for sure and ``name`` is not among its troubled members."""
        known = self._families.get(base)
        if known is None or known.generation != self.generation or self._forks != _forks:
            return False
        return time.monotonic() - known.learnt <= MAX_KNOWLEDGE_AGE and name not in known.troubled

    def holds_member(self, base: str, name: str) -> bool:
        """Whether the process knows for sure that derived breaker ``name`` is troubled (its
        family is known, and lists it)."""
        known = self._families.get(base)
        if known is None or known.generation != self.generation or self._forks != _forks:
            return False
        return time.monotonic() - known.learnt <= MAX_KNOWLEDGE_AGE and name in known.troubled

    def family_due(self, base: str) -> bool:
        """Whether the family of ``base`` needs a refresh (``refresh_family``) to be known, and
        none was asked for lately (a family too troubled to list is asked once in a while)."""
        now = time.monotonic()
        if now - self._family_asked.get(base, -MAX_KNOWLEDGE_AGE) < MAX_KNOWLEDGE_AGE / 2:
            return False
        known = self._families.get(base)
        return (
            known is None
            or known.generation != self.generation
            or now - known.learnt > MAX_KNOWLEDGE_AGE / 2
        )

    def defer_member_success(self, base: str) -> bool:
        """Hold back one success on a member known closed; ``False`` if the family is not
        known (then the success is recorded at once)."""
        with self._lock:
            known = self._families.get(base)
            if known is None or known.generation != self.generation:
                return False
            known.deferred += 1
            return True

    def families_holding_successes(self) -> list[str]:
        return [base for base, known in list(self._families.items()) if known.deferred]

    def take_member_successes(self, base: str) -> int:
        with self._lock:
            known = self._families.get(base)
            if known is None:
                return 0
            deferred, known.deferred = known.deferred, 0
            return deferred

    def refresh_family(self, base: str, idle_us: int, generation: int | None = None) -> None:
        """Ask the store how the family of ``base`` is, with the successes held back on its
        members (a store without families is left alone: every call on them asks it)."""
        family = getattr(self._store(), "family", None)
        if family is None:
            return
        generation = self.start() if generation is None else generation
        if generation == NOT_LIVE:
            return  # nothing learnt before the watch is live could be trusted
        self._family_asked[base] = time.monotonic()
        successes = self.take_member_successes(base)
        try:
            view = family(base, idle_us, successes)
        except BaseException:
            self.give_member_successes(base, successes)
            raise
        self.learn_family(base, view, generation)

    def give_member_successes(self, base: str, successes: int) -> None:
        with self._lock:
            known = self._families.get(base)
            if known is not None:
                known.deferred += successes

    def learn_family(self, base: str, view: FamilyReport, generation: int) -> None:
        """A family's report (``BreakerStore.family``), asked during ``generation``."""
        if generation == NOT_LIVE:
            return
        with self._lock:
            if generation != self.generation:
                return
            old = self._families.get(base)
            if old is not None and old.generation == generation and old.epoch == view.epoch:
                # The feed may have brought a newer change while the report was on its way:
                # an older report must not undo it; an equal one confirms what is known.
                if view.version < old.version:
                    return
                if view.version == old.version:
                    old.learnt = time.monotonic()
                    return
            known = KnownFamily.of(view, generation, time.monotonic())
            self._families.pop(base, None)
            if known is not None:
                # Successes held back while the report was asked go with the next one.
                known.deferred = old.deferred if old is not None else 0
                self._families[base] = known

    def confirm_family(
        self, base: str, name: str, reply: Decision | Change, generation: int
    ) -> bool:
        """A member's reply: renew what the process knows of its family if the reply shows
        nothing it missed (a change the reply's own script made is applied as heard: the feed
        brings it later); ``False`` if the family is not known for sure after it."""
        family = reply.family
        if family is None or generation == NOT_LIVE:
            return False
        with self._lock:
            known = self._families.get(base)
            if known is None or generation != self.generation or known.generation != generation:
                return False
            own_change = reply.family_changed and family[0] == known.version + 1
            if own_change and not known.heard(family, name, reply.state, reply.streak):
                del self._families[base]
                return False
            if known.confirms(family):
                known.learnt = time.monotonic()
                return True
            if known.contradicts(family):
                del self._families[base]
            return False

    # -- learning -------------------------------------------------------------------------------
    def start(self) -> int:
        """Make sure this process watches (after a fork too, and after its watch's thread died
        for good); the generation to learn under."""
        if self._pid != os.getpid() or not _alive(self._watch):
            with self._lock:
                if self._pid != os.getpid() or not _alive(self._watch):
                    if self._watch is not None:
                        self._watch.close()
                    self._breakers.clear()
                    self._families.clear()
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
            known = self._breakers.get(name)
            now = time.monotonic()
            if (
                known is None
                or known.generation != generation
                or known.epoch != epoch  # replies come from this process's own keys
                or now - known.learnt > MAX_KNOWLEDGE_AGE  # too old to order anything
                or version >= known.version
            ):
                self._breakers[name] = KnownBreaker(version, state, streak, generation, epoch, now)

    def forget(self) -> None:
        """Redis did not answer: trust nothing until the watch says it is live again."""
        with self._lock:
            self._breakers.clear()
            self._families.clear()

    def close(self) -> None:
        with self._lock:
            if self._watch is not None:
                self._watch.close()
            self._watch, self._pid, self._forks, self.generation = None, -1, -1, NOT_LIVE
            self._breakers.clear()
            self._families.clear()

    # -- the watch's callbacks ------------------------------------------------------------------
    def _heard(
        self,
        name: str,
        version: int,
        state: State,
        streak: bool,
        epoch: str,
        family: Family | None = None,
    ) -> None:
        if family is not None:
            self._heard_member(name, state, streak, family)
            return
        with self._lock:
            known = self._breakers.get(name)
            if known is None or self.generation == NOT_LIVE:
                return  # nothing to check the change against: the next call asks Redis
            # A view without an epoch was learnt before the hash existed: whatever made it since
            # counts its versions from 0 too, so the change is newer. Any other epoch is not
            # the state this process knew (recreated, or not its keys at all): ask Redis again.
            if known.generation != self.generation or known.epoch not in ("", epoch):
                del self._breakers[name]
            elif version >= known.version:
                # Confirms nothing about the age: only a reply renews ``learnt``.
                self._breakers[name] = KnownBreaker(
                    version, state, streak, known.generation, epoch, known.learnt
                )

    def _heard_member(self, name: str, state: State, streak: bool, family: Family) -> None:
        base = self._family_of(name)
        with self._lock:
            known = self._families.get(base) if base is not None else None
            if known is None or self.generation == NOT_LIVE:
                return
            if known.generation != self.generation or not known.heard(family, name, state, streak):
                del self._families[base]  # type: ignore[arg-type]

    def _live(self) -> None:
        with self._lock:
            self._periods += 1
            self.generation = self._periods

    def _lost(self) -> None:
        with self._lock:
            self.generation = NOT_LIVE
            self._breakers.clear()
            self._families.clear()


def _alive(watch: Watch | None) -> bool:
    """A watch whose thread ended for good (if it has one) is no watch."""
    if watch is None:
        return False
    is_alive = getattr(watch, "is_alive", None)
    return is_alive is None or bool(is_alive())
