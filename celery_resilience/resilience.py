"""``Resilience.for_app(app)``: the public facade of the package, one per Celery app.

It sits on top: breakers and connections come from the app's :class:`Runtime` (below it), the
use cases (drain, replay) from their own modules. Nothing below imports this module.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import redis

from . import runtime as runtimes
from .breaker.breaker import Breaker
from .breaker.store import BreakerStore
from .config import ResilienceConfig
from .drain import Drainer, DrainReport
from .parked.entry import ParkedTask
from .parked.store import BackoutStore
from .parked.view import Backout
from .replay import replay
from .runtime import Runtime

_facades: weakref.WeakKeyDictionary[Runtime, Resilience] = weakref.WeakKeyDictionary()
_facades_lock = threading.Lock()


class Resilience:
    """Breakers, the back-out store and the drain of one Celery app."""

    def __init__(
        self,
        app: Any,
        config: ResilienceConfig | None = None,
        breaker_store: BreakerStore | None = None,
        backout: BackoutStore | None = None,
        *,
        runtime: Runtime | None = None,
    ) -> None:
        #: Settings, connections, breakers and stores (what the rest of the package uses).
        self.runtime = runtime or Runtime(app, config, breaker_store, backout)

    @classmethod
    def for_app(cls, app: Any) -> Resilience:
        """The app's one instance, made (and its settings validated) on first use."""
        runtime = Runtime.for_app(app)
        with _facades_lock:
            facade = _facades.get(runtime)
            if facade is None:
                facade = _facades[runtime] = cls(app, runtime=runtime)
            return facade

    @classmethod
    def install(cls, app: Any, instance: Resilience) -> Resilience:
        """Use ``instance`` for ``app`` from now on (tests, or a custom store)."""
        with _facades_lock:
            _facades[instance.runtime] = instance
        runtimes.install(app, instance.runtime)
        return instance

    # -- what the runtime holds ---------------------------------------------------------------
    @property
    def app(self) -> Any:
        return self.runtime.app

    @property
    def config(self) -> ResilienceConfig:
        """The app's settings, read and validated once."""
        return self.runtime.config

    def breaker(self, name: str) -> Breaker:
        """The shared breaker ``name`` (settings from ``resilience_breakers`` or the defaults)."""
        return self.runtime.breaker(name)

    def breaker_names(self) -> list[str]:
        """Configured breakers and every breaker that has state in the store."""
        return self.runtime.breaker_names()

    @property
    def redis(self) -> redis.Redis:
        """The Redis client of breakers and store (``StoreUnavailable`` with ``memory://``)."""
        return self.runtime.redis

    @property
    def backout_store(self) -> BackoutStore:
        """The store behind ``backout``, with the drain's side (claim, ack) and the counters."""
        return self.runtime.backout_store

    def now(self) -> float:
        """Epoch seconds from Redis ``TIME`` (the fleet's one clock), or local time if down."""
        return self.runtime.now()

    def flush(self) -> None:
        """Send every breaker's deferred successes now (a script that ends, worker shutdown)."""
        self.runtime.flush()

    def reset_connections(self) -> None:
        """Forget this process's connections: the next use opens new ones (after a fork)."""
        self.runtime.reset_connections()

    def close(self) -> None:
        """Stop watching the breakers and close this process's connections (tests, shutdown)."""
        self.runtime.close()

    # -- the use cases ------------------------------------------------------------------------
    @property
    def backout(self) -> Backout:
        """The back-out store: where tasks that can't run now are parked."""
        return Backout(self.runtime.backout_store, self.replay)

    def drain(
        self,
        breaker: str | None = None,
        limit: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> DrainReport:
        """Replay every due entry of breakers that admit calls (all breakers unless one is
        named), in batches paced at ``resilience_drain_rate``, waiting between them: a person's
        drain. ``progress(n)`` hears after each batch how many entries it finished."""
        return Drainer(self.runtime, progress=progress).run(breaker, limit)

    def drain_once(self, breaker: str | None = None, limit: int | None = None) -> DrainReport:
        """Replay what may go out now and return without waiting (beat's drain task): no more
        than the replays' queues have room for, the slow start after a close and the rate
        ceiling allow. ``report.next_in`` says when another pass has work."""
        return Drainer(self.runtime).step(breaker, limit)

    def replay(self, entry_id: str) -> ParkedTask:
        """Publish one parked entry now, whatever its breaker says."""
        return replay(self.runtime, entry_id)

    def beat_schedule(self, every: float = 30.0) -> dict[str, Any]:
        """The entry to put in ``app.conf.beat_schedule`` to drain every ``every`` seconds.

        ``expires`` keeps drains from piling up in the queue while workers are busy.
        """
        return {
            "task": "celery_resilience.drain",
            "schedule": every,
            "options": {"expires": every},
        }
