"""``Resilience.for_app(app)``: the public facade of the package, one per Celery app.

It holds nothing but the app's :class:`Runtime` (the one per-app object, in the one registry of
``runtime.py``) and offers only the public contract: breakers, the back-out store, the drain and
replay, the beat entry. The rest of the package, its tests and tools reach the internals as
``resilience.runtime``. Nothing below imports this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import runtime as runtimes
from .backout.entry import ParkedTask
from .backout.facade import Backout
from .backout.store import BackoutStore
from .breaker.breaker import Breaker
from .breaker.store import BreakerStore
from .config import ResilienceConfig
from .drain import Drainer, DrainReport
from .drain.replay import replay
from .runtime import Runtime


class Resilience:
    """Breakers, the back-out store and the drain of one Celery app.

    ``Resilience(app, ...)`` makes a new one, with its own settings or stores, that the app's
    tasks do not use until :meth:`install` makes it the app's (tests, a custom store)."""

    __slots__ = ("_runtime",)

    def __init__(
        self,
        app: Any,
        config: ResilienceConfig | None = None,
        breaker_store: BreakerStore | None = None,
        backout: BackoutStore | None = None,
    ) -> None:
        self._runtime = Runtime(app, config, breaker_store, backout)

    @classmethod
    def _over(cls, runtime: Runtime) -> Resilience:
        """The facade of a runtime that exists already (``__init__`` makes a new one)."""
        facade = cls.__new__(cls)
        facade._runtime = runtime
        return facade

    @classmethod
    def for_app(cls, app: Any) -> Resilience:
        """The app's one instance, made (and its settings validated) on first use."""
        return cls._over(Runtime.for_app(app))

    @classmethod
    def install(cls, app: Any, instance: Resilience) -> Resilience:
        """Make ``instance`` the app's from now on (tests, or a custom store); returns it."""
        runtimes.install(app, instance.runtime)
        return instance

    @property
    def runtime(self) -> Runtime:
        """The app's runtime: settings, connections, stores, the clock. The package's internals
        (its surfaces, tests and tools use them), not part of the stable contract."""
        return self._runtime

    # One runtime, one facade: two facades of one runtime are the same.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, Resilience) and other._runtime is self._runtime

    def __hash__(self) -> int:
        return id(self._runtime)

    def __repr__(self) -> str:
        return f"<Resilience of {self._runtime.app!r}>"

    # -- the public contract ----------------------------------------------------------------
    def breaker(self, name: str, key: str | None = None) -> Breaker:
        """The shared breaker ``name`` (settings from ``resilience_breakers`` or the defaults).

        With ``key`` (a host, a tenant), the breaker named at call time ``<name>:<key>``: it has
        the settings of the declared breaker ``name`` and leaves no keys behind once idle for
        its ``idle_timeout``."""
        return self._runtime.breaker(name, key)

    @property
    def backout(self) -> Backout:
        """The back-out store: where tasks that can't run now are parked."""
        return Backout(self._runtime.backout_store, self.replay)

    def drain(
        self,
        breaker: str | None = None,
        limit: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> DrainReport:
        """Replay every due entry of breakers that admit calls (all breakers unless one is
        named), in batches paced at ``resilience_drain_rate``, waiting between them: a person's
        drain. ``progress(n)`` hears after each batch how many entries it finished."""
        return Drainer(self._runtime, progress=progress).run(breaker, limit)

    def drain_once(self, breaker: str | None = None, limit: int | None = None) -> DrainReport:
        """One pass (beat's drain task): replay what may go out now and return without waiting:
        no more than the replays' queues have room for, the slow start after a close and the
        rate ceiling allow. ``report.next_in`` says when another pass has work."""
        return Drainer(self._runtime).drain_once(breaker, limit)

    def replay(self, entry_id: str) -> ParkedTask:
        """Publish one parked entry now, whatever its breaker says."""
        return replay(self._runtime, entry_id)

    def beat_schedule(self, every: float = 30.0) -> dict[str, Any]:
        """The entry to put in ``app.conf.beat_schedule`` to drain every ``every`` seconds.

        ``expires`` keeps drains from piling up in the queue while workers are busy.
        """
        return {
            "task": "celery_resilience.drain",
            "schedule": every,
            "options": {"expires": every},
        }
