"""``Resilience.for_app(app)``: the one object per Celery app that owns settings and connections.

Connections are made lazily and again in every process: after a fork (prefork pool children)
nothing opened by the parent is used, since a shared socket would interleave replies.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .breaker.breaker import Admission, Breaker, RedisHealth, TransitionListener
from .breaker.memory import MemoryBreakerStore
from .breaker.redis import RedisBreakerStore
from .breaker.store import BreakerStore, Delivery
from .breaker.views import Views
from .config import ResilienceConfig, backout_store_factory
from .drain import Drainer, DrainReport, replay
from .errors import StoreUnavailable
from .events import send_breaker_event
from .parked.entry import ParkedTask
from .parked.memory import MemoryBackoutStore
from .parked.redis import RedisBackoutStore
from .parked.store import BackoutStore
from .parked.view import Backout
from .redact import get_logger
from .trouble import TroubleLog

logger = get_logger("celery_resilience")
_instances: weakref.WeakKeyDictionary[Any, Resilience] = weakref.WeakKeyDictionary()
_instances_lock = threading.Lock()


def installed(app: Any) -> Resilience | None:
    """The app's instance if one was made or installed, without making one."""
    with _instances_lock:
        return _instances.get(app)


def forget(app: Any) -> None:
    """Drop the app's instance: the next ``for_app`` makes a new one (tests)."""
    with _instances_lock:
        _instances.pop(app, None)


def all_instances() -> list[Resilience]:
    with _instances_lock:
        return list(_instances.values())


def make_redis_client(config: ResilienceConfig, retry: bool = True) -> redis.Redis:
    """A client that gives up within ``resilience_redis_timeout`` instead of redis-py's seconds.

    With ``retry``, one retry without backoff lets a pooled connection that Redis closed (a
    restart) reconnect at once: for reads and for writes that may safely run twice (a park is
    idempotent on its entry id). Without it, a command is sent once: the breaker's scripts count
    and grant probes, and one whose reply was lost may have run, so sending it again could
    count a failure twice or grant one probe too many. Timeouts are never retried.
    """
    return redis.Redis.from_url(
        config.redis_url,
        socket_connect_timeout=config.redis_timeout,
        socket_timeout=config.redis_timeout,
        retry=Retry(NoBackoff(), 1 if retry else 0, supported_errors=(redis.ConnectionError,)),
        # No health check: its PING has a retry of its own, which made a hanging Redis cost
        # four timeouts per call instead of two; the retry above handles a stale connection.
        health_check_interval=0,
    )


class Resilience:
    """Settings, Redis connection, breakers and back-out store of one Celery app."""

    def __init__(
        self,
        app: Any,
        config: ResilienceConfig | None = None,
        breaker_store: BreakerStore | None = None,
        backout: BackoutStore | None = None,
    ) -> None:
        self.app = app
        self.config = config if config is not None else ResilienceConfig.from_app(app)
        self.health = RedisHealth(self.config.on_redis_error)
        #: Send Flower-visible events for breaker transitions (off in tests that don't care).
        self.send_events = True
        self.transition_listeners: list[TransitionListener] = [self._send_transition_event]
        #: Failures to park, and to publish a retry, logged once per cause (their own loggers).
        self.park_trouble = TroubleLog(get_logger("celery_resilience.park"), "parking")
        self.retry_trouble = TroubleLog(get_logger("celery_resilience.task"), "publishing retries")
        self.clock_trouble = TroubleLog(logger, "Redis TIME")
        self._fixed_breaker_store = breaker_store
        self._fixed_backout = backout
        self._backout: BackoutStore | None = None
        self._breakers: dict[str, Breaker] = {}
        self._lock = threading.Lock()
        self._pid = -1
        self._client: redis.Redis | None = None
        self._breaker_store: BreakerStore | None = None
        #: What this process knows of the breakers between round trips (one watch for all).
        self.views = Views(lambda: self.breaker_store)

    def _send_transition_event(self, breaker: str, transition: str, state: str) -> None:
        if self.send_events:
            send_breaker_event(self.app, breaker, transition, state)

    @classmethod
    def for_app(cls, app: Any) -> Resilience:
        """The app's one instance, made (and its settings validated) on first use."""
        instance = _instances.get(app)  # the hot path (every task): no lock once made
        if instance is not None:
            return instance
        with _instances_lock:
            instance = _instances.get(app)
            if instance is None:
                instance = _instances[app] = cls(app)
            return instance

    @classmethod
    def install(cls, app: Any, instance: Resilience) -> Resilience:
        """Use ``instance`` for ``app`` from now on (tests, or a custom store)."""
        with _instances_lock:
            _instances[app] = instance
        return instance

    # -- connections, made again after a fork ---------------------------------------------
    def _connect(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                return
            if self.config.in_memory:
                # One process, nothing shared: the stores outlive forks only as copies.
                self._breaker_store = self._fixed_breaker_store or MemoryBreakerStore()
                self._backout = self._fixed_backout or MemoryBackoutStore(
                    max_entries=self.config.backout_max_entries,
                    dead_ttl=self.config.dead_ttl,
                    serializer=self.config.serializer,
                    accept=self.app.conf.accept_content,
                )
                self._fixed_breaker_store, self._fixed_backout = self._breaker_store, self._backout
                self._pid = os.getpid()
                return
            self._client = make_redis_client(self.config)
            self._breaker_store = self._fixed_breaker_store or RedisBreakerStore(
                make_redis_client(self.config, retry=False), self.config.key_prefix
            )
            self._backout = (
                self._fixed_backout
                or self._custom_backout()
                or RedisBackoutStore(
                    self._client,
                    self.config.key_prefix,
                    serializer=self.config.serializer,
                    accept=self.app.conf.accept_content,
                    max_entries=self.config.backout_max_entries,
                    dead_ttl=self.config.dead_ttl,
                )
            )
            self._pid = os.getpid()

    def _custom_backout(self) -> BackoutStore | None:
        """The store named by ``resilience_backout_store`` when it is not Redis."""
        if self.config.backout_store == "redis":
            return None
        store: BackoutStore = backout_store_factory(self.config.backout_store)(self)
        return store

    def reset_connections(self) -> None:
        """Forget connections so the next use opens new ones (``worker_process_init``)."""
        with self._lock:
            self._pid = -1

    def close(self) -> None:
        """Stop watching the breakers and close this process's connections (tests, shutdown)."""
        self.views.close()
        with self._lock:
            for client in (self._client, getattr(self._breaker_store, "client", None)):
                if client is not None:
                    client.close()
            self._pid = -1

    @property
    def redis(self) -> redis.Redis:
        """The Redis client of breakers and store (``StoreUnavailable`` with ``memory://``)."""
        if self._pid != os.getpid():
            self._connect()
        if self._client is None:
            raise StoreUnavailable("resilience_redis_url is memory://: there is no Redis")
        return self._client

    @property
    def breaker_store(self) -> BreakerStore:
        """The store every breaker of this app keeps its state in (Redis, or memory)."""
        if self._pid != os.getpid():
            self._connect()
        assert self._breaker_store is not None
        return self._breaker_store

    @property
    def backout(self) -> Backout:
        """The back-out store: where tasks that can't run now are parked."""
        return Backout(self.backout_store, self.replay)

    @property
    def backout_store(self) -> BackoutStore:
        """The store behind ``backout``, with the drain's side (claim, ack, stats)."""
        if self._pid != os.getpid():
            self._connect()
        assert self._backout is not None
        return self._backout

    # -- drain and replay -------------------------------------------------------------------
    def drain(self, breaker: str | None = None, limit: int | None = None) -> DrainReport:
        """Replay due entries of breakers that admit calls (all breakers unless one is named)."""
        return Drainer(self).run(breaker, limit)

    def replay(self, entry_id: str) -> ParkedTask:
        """Publish one parked entry now, whatever its breaker says."""
        return replay(self, entry_id)

    def beat_schedule(self, every: float = 30.0) -> dict[str, Any]:
        """The entry to put in ``app.conf.beat_schedule`` to drain every ``every`` seconds.

        ``expires`` keeps drains from piling up in the queue while workers are busy.
        """
        return {
            "task": "celery_resilience.drain",
            "schedule": every,
            "options": {"expires": every},
        }

    # -- breakers ---------------------------------------------------------------------------
    def breaker(self, name: str) -> Breaker:
        """The shared breaker ``name`` (settings from ``resilience_breakers`` or the defaults)."""
        breaker = self._breakers.get(name)
        if breaker is None:
            with self._lock:
                breaker = self._breakers.get(name)
                if breaker is None:
                    breaker = Breaker(
                        name,
                        self.config.breaker(name),
                        lambda: self.breaker_store,
                        self.health,
                        self.transition_listeners,
                        self.views,
                    )
                    self._breakers[name] = breaker
        return breaker

    def flush(self) -> None:
        """Send every breaker's deferred successes now (worker shutdown)."""
        for breaker in list(self._breakers.values()):
            breaker.flush()

    def deliver(self, scope: str | None, delivery: Delivery) -> Admission:
        """The delivery questions of a task without a breaker (one round trip)."""
        try:
            deliveries, skip = self.breaker_store.deliver(scope, delivery)
        except redis.RedisError as exc:
            self.health.failed(scope or "-", exc)
            return Admission(None, None)
        return Admission(None, None, deliveries, skip)

    def mark_done(self, scope: str | None, task_id: str) -> None:
        """Remember that ``task_id`` succeeded (``deduplicate=True``)."""
        try:
            self.breaker_store.mark_done(scope, task_id, int(self.config.dedup_ttl))
        except redis.RedisError as exc:
            self.health.failed(scope or "-", exc)

    def count_retry(self, breaker: str | None) -> None:
        """Count a scheduled retry for metrics (the retry path publishes anyway: not hot)."""
        try:
            self.backout_store.bump({f"retries|{breaker or '-'}": 1})
        except Exception:  # a metric must never stop a retry
            logger.debug("Could not count a retry", exc_info=True)

    def now(self) -> float:
        """Epoch seconds from Redis ``TIME`` (the fleet's one clock), or local time if down."""
        try:
            seconds, micros = self.redis.time()
        except (redis.RedisError, StoreUnavailable) as exc:
            if not self.config.in_memory:
                self.clock_trouble.failed(exc, "Redis TIME unavailable: using this host's clock")
            return time.time()
        self.clock_trouble.ok()
        return float(seconds) + micros / 1_000_000

    def breaker_names(self) -> list[str]:
        """Configured breakers and every breaker that has state in the store."""
        names = set(self.config.breakers)
        store_names = getattr(self.breaker_store, "names", None)
        if store_names is not None:
            names |= store_names()
        return sorted(names)
