"""The per-app runtime: settings, connections, breakers, stores, the delivery guard and the clock.

One :class:`Runtime` per Celery app, made on first use (settings validated then) and kept in the
package's one registry, below. Everything the package does goes through it;
:class:`~celery_resilience.Resilience` is the public facade on top: it holds nothing but a
runtime, and offers the public contract (breakers, the back-out store, drain, replay).

Connections are made lazily and again in every process: after a fork (prefork pool children)
nothing opened by the parent is used, since a shared socket would interleave replies.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import time
import weakref
from collections import OrderedDict
from typing import Any, cast

import redis

from .backout.codec import Codec
from .backout.memory import MemoryBackoutStore
from .backout.redis import BackoutKeys, RedisBackoutStore
from .backout.store import BackoutStore, counter_scope
from .breaker.breaker import Breaker, TransitionListener
from .breaker.fallback import FallbackTally
from .breaker.health import RedisHealth
from .breaker.knowledge import Knowledge
from .breaker.memory import MemoryBreakerStore
from .breaker.permit import Admission
from .breaker.redis import RedisBreakerStore
from .breaker.store import BreakerStore, DeliveryGuard, DeliveryQuestions
from .config import ResilienceConfig, backout_store_factory, derived_name
from .config.limits import WorkerLimits
from .errors import StoreUnavailable
from .events import send_breaker_event
from .fleet import Fleet
from .redact import get_logger
from .redis_io import make_client, redis_time
from .tracing import Tracing
from .trouble import TroubleLog

logger = get_logger("celery_resilience")
#: The module that turns ``resilience_tracing`` on, named rather than imported: it sits above
#: the runtime, and imports OpenTelemetry.
OPENTELEMETRY = "celery_resilience.contrib.opentelemetry"
#: Derived breakers a process keeps made (a webhook sender calls thousands of hosts).
DERIVED_KEPT = 1024
#: The registry: each app's one runtime (an app that is collected takes its runtime along).
_runtimes: weakref.WeakKeyDictionary[Any, Runtime] = weakref.WeakKeyDictionary()
_runtimes_lock = threading.Lock()


def installed(app: Any) -> Runtime | None:
    """The app's runtime if one was made or installed, without making one."""
    with _runtimes_lock:
        return _runtimes.get(app)


def install(app: Any, runtime: Runtime) -> None:
    """Use ``runtime`` for ``app`` from now on (tests, or a custom store)."""
    if runtime.app is not app:
        raise ValueError(f"this runtime was made for {runtime.app!r}, not for {app!r}")
    with _runtimes_lock:
        _runtimes[app] = runtime


def forget(app: Any) -> None:
    """Drop the app's runtime: the next ``for_app`` makes a new one (tests)."""
    with _runtimes_lock:
        _runtimes.pop(app, None)


def all_runtimes() -> list[Runtime]:
    with _runtimes_lock:
        return list(_runtimes.values())


class Runtime:
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
        #: The spans of the package's steps (``tracing.py``): ``None`` while tracing is off.
        self.tracing: Tracing | None = None
        if self.config.tracing:
            importlib.import_module(OPENTELEMETRY).trace(self)
        #: Failures to park, to publish a retry, to drain: logged once per cause (own loggers).
        self.park_trouble = TroubleLog(get_logger("celery_resilience.park"), "parking")
        self.retry_trouble = TroubleLog(get_logger("celery_resilience.task"), "publishing retries")
        self.clock_trouble = TroubleLog(logger, "Redis TIME")
        self.drain_trouble = TroubleLog(get_logger("celery_resilience.drain"), "draining", False)
        self._fixed_breaker_store = breaker_store
        self._fixed_backout = backout
        self._backout: BackoutStore | None = None
        self._breakers: dict[str, Breaker] = {}
        #: Derived breakers, the most recently made last (they hold nothing a process must keep:
        #: what it knows of them is its family's, in ``knowledge``).
        self._derived: OrderedDict[str, Breaker] = OrderedDict()
        self._lock = threading.Lock()
        self._pid = -1
        self._client: redis.Redis | None = None
        self._breaker_store: BreakerStore | None = None
        #: Fallbacks of ``Breaker.call`` counted for the metrics, in the store's counters.
        self.fallbacks = FallbackTally(
            lambda counts: self.backout_store.bump(counts),  # noqa: PLW0108 - made on first use
            lambda name: counter_scope(name, self.config.family_of),
        )
        #: What this process knows of the breakers between round trips (one watch for all).
        self.knowledge = Knowledge(lambda: self.breaker_store, self.config.family_of)
        #: The time limits of the worker this process serves (set at its start, inherited by
        #: its pool's children): what a task without limits of its own runs under.
        self.worker = WorkerLimits()
        #: The fleet's recorded minimum version: which envelope entries are written in.
        self.fleet = Fleet(
            None if self.config.in_memory else (lambda: self.redis), self.config.key_prefix
        )

    def codec(self) -> Codec:
        """The codec of this app's settings, writing the envelope the fleet reads."""
        return Codec.of(self.config, envelope=self.fleet.envelope)

    @classmethod
    def for_app(cls, app: Any) -> Runtime:
        """The app's one runtime, made (and its settings validated) on first use."""
        runtime = _runtimes.get(app)  # the hot path (every task): no lock once made
        if runtime is not None:
            return runtime
        with _runtimes_lock:
            runtime = _runtimes.get(app)
            if runtime is None:
                runtime = _runtimes[app] = cls(app)
            return runtime

    def use_tracing(self, tracing: Tracing | None) -> None:
        """Make the package's spans with ``tracing`` from now on (``None``: none)."""
        self.tracing = tracing
        if self._trace_transition not in self.transition_listeners:
            self.transition_listeners.append(self._trace_transition)

    def _trace_transition(self, breaker: str, transition: str, state: str) -> None:
        if self.tracing is not None:
            self.tracing.transition(breaker, transition, state)

    def _send_transition_event(self, breaker: str, transition: str, state: str) -> None:
        if self.send_events:
            send_breaker_event(self.app, breaker, transition, state)

    # -- connections, made again after a fork ---------------------------------------------
    def _connect(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                return
            config = self.config
            if config.in_memory:
                # One process, nothing shared: the stores outlive forks only as copies.
                self._breaker_store = self._fixed_breaker_store or MemoryBreakerStore()
                self._backout = self._fixed_backout or MemoryBackoutStore(
                    max_entries=config.backout_max_entries,
                    dead_ttl=config.dead_ttl,
                    codec=self.codec(),
                )
                self._fixed_breaker_store, self._fixed_backout = self._breaker_store, self._backout
                self._scope_counters()
                self._pid = os.getpid()
                return
            where = config.redis_deployment  # one server, Sentinel's primary, or a Cluster
            self._client = make_client(where, config.redis_timeout)
            self._breaker_store = self._fixed_breaker_store or RedisBreakerStore(
                make_client(where, config.redis_timeout, retry=False),
                config.key_prefix,
                config.family_of,
            )
            self._backout = (
                self._fixed_backout
                or self._custom_backout()
                or RedisBackoutStore(
                    self._client,
                    config.key_prefix,
                    codec=self.codec(),
                    max_entries=config.backout_max_entries,
                    dead_ttl=config.dead_ttl,
                    # WAIT must answer before the socket times out: half the timeout each.
                    replicas=config.park_replicas,
                    replicas_timeout=config.redis_timeout / 2,
                )
            )
            self._scope_counters()
            self._pid = os.getpid()

    def _scope_counters(self) -> None:
        # The store's counters name breakers named at call time by their base (a store of
        # another kind may not know of them: it counts per name).
        if self._backout is not None and hasattr(self._backout, "family_of"):
            self._backout.family_of = self.config.family_of

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
        self.knowledge.close()
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
    def guard(self) -> DeliveryGuard:
        """The delivery guard: redelivery counts and dedup markers, beside the breakers."""
        # The breaker stores guard deliveries too: the questions ride in the permit's round trip.
        return cast(DeliveryGuard, self.breaker_store)

    @property
    def backout_store(self) -> BackoutStore:
        """The store of parked tasks, with the drain's side (claim, ack) and the counters."""
        if self._pid != os.getpid():
            self._connect()
        assert self._backout is not None
        return self._backout

    # -- breakers ---------------------------------------------------------------------------
    def breaker(self, name: str, key: str | None = None) -> Breaker:
        """The shared breaker ``name`` (settings from ``resilience_breakers`` or the defaults);
        with ``key``, the breaker ``<name>:<key>`` derived from the declared breaker ``name``."""
        if key is not None:
            name = derived_name(self.config.breakers, name, key)
        breaker = self._breakers.get(name) or self._derived.get(name)
        if breaker is not None and breaker.base is not None:
            with contextlib.suppress(KeyError):  # another thread may have let it go meanwhile
                self._derived.move_to_end(name)  # kept: called lately
        if breaker is None:
            base = self.config.family_of(name)
            with self._lock:
                breaker = self._breakers.get(name) or self._derived.get(name)
                if breaker is None:
                    breaker = Breaker(
                        name,
                        self.config.breaker(name),
                        lambda: self.breaker_store,
                        self.health,
                        self.transition_listeners,
                        self.knowledge,
                        base=base,
                        fallbacks=self.fallbacks.count,
                    )
                    if base is None:
                        self._breakers[name] = breaker
                    else:  # named at call time: the process keeps the ones called lately
                        self._derived[name] = breaker
                        if len(self._derived) > DERIVED_KEPT:
                            self._derived.popitem(last=False)
        return breaker

    def flush(self) -> None:
        """Send every breaker's deferred successes now (worker shutdown), the ones held back on
        derived breakers with their family's refresh, and the calls each breaker's rate limit
        turned away here since its last lease (derived breakers' too)."""
        with self._lock:
            breakers = [*self._breakers.values(), *self._derived.values()]
        for breaker in breakers:
            breaker.flush()
        for base in self.knowledge.families_holding_successes():
            self.refresh_family(base)

    def refresh_family(self, base: str) -> None:
        """Ask Redis how the family of derived breakers of ``base`` is (``knowledge.py``)."""
        idle_us = round(self.config.breakers[base].idle_timeout * 1_000_000)
        try:
            self.knowledge.refresh_family(base, idle_us)
        except redis.RedisError as exc:
            self.knowledge.forget()
            self.health.failed(base, exc)

    def breaker_names(self) -> list[str]:
        """Configured breakers and every breaker that has state in the store."""
        names = set(self.config.breakers)
        store_names = getattr(self.breaker_store, "names", None)
        if store_names is not None:
            names |= store_names()
        return sorted(names)

    # -- the delivery guard, for tasks without a breaker -------------------------------------
    def deliver(self, scope: str | None, delivery: DeliveryQuestions) -> Admission:
        """The delivery questions of a task without a breaker (one round trip)."""
        try:
            deliveries, skip, wait_us = self.guard.deliver(scope, delivery)
        except redis.RedisError as exc:
            self.health.failed(scope or "-", exc)
            return Admission(None, None)
        claim = delivery.claim if delivery.claims and not skip else ""
        return Admission(None, None, deliveries, skip, claim=claim, wait=wait_us / 1e6)

    def mark_done(self, scope: str | None, task_id: str, key: str = "") -> None:
        """Remember that ``task_id`` (or its dedup ``key``) succeeded (``deduplicate``); it
        replaces the claim."""
        try:
            self.guard.mark_done(scope, task_id, int(self.config.dedup_ttl), key)
        except redis.RedisError as exc:
            self.health.failed(scope or "-", exc)

    def unclaim(self, scope: str | None, task_id: str, claim: str, key: str = "") -> None:
        """Give back this delivery's claim on ``task_id`` (or its dedup ``key``): it did not
        succeed (``deduplicate``). If Redis can't be told, the claim's lease ends it."""
        try:
            self.guard.unclaim(scope, task_id, claim, key)
        except redis.RedisError as exc:
            self.health.failed(scope or "-", exc)

    def claim_left(self, scope: str | None, task_id: str, key: str = "") -> float:
        """Seconds until the claim a delivery holds on ``task_id`` (or ``key``) ends at the
        latest (0: none held): a delivery of the id waits in the broker for it."""
        end = self.guard.claim_end(scope, task_id, key)
        return max(0.0, end / 1e6 - self.now()) if end else 0.0

    # -- counters and clock -------------------------------------------------------------------
    def count_retry(self, breaker: str | None) -> None:
        """Count a scheduled retry for metrics (the retry path publishes anyway: not hot)."""
        try:
            scope = counter_scope(breaker, self.config.family_of) if breaker else "-"
            self.backout_store.bump({f"retries|{scope}": 1})
        except Exception:  # a metric must never stop a retry
            logger.debug("Could not count a retry", exc_info=True)

    def now(self) -> float:
        """Epoch seconds from Redis ``TIME`` (the fleet's one clock), or local time if down."""
        try:
            # On a cluster, the clock of the node holding parked tasks: their times are its.
            now = redis_time(self.redis, BackoutKeys.for_prefix(self.config.key_prefix).tag)
        except (redis.RedisError, StoreUnavailable) as exc:
            if not self.config.in_memory:
                self.clock_trouble.failed(exc, "Redis TIME unavailable: using this host's clock")
            return time.time()
        self.clock_trouble.ok()
        return now
