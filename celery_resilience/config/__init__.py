"""Settings: read once from ``app.conf`` (prefix ``resilience_``) into frozen, validated objects.

Defaults live here, in code, and are never written into ``app.conf``: Celery's
``add_defaults`` would take precedence over the user's own configuration.
Every invalid value raises :class:`ConfigurationError` naming the setting and the value.

This module holds :data:`SETTINGS` and :class:`ResilienceConfig`; ``breakers.py`` one breaker's
settings, ``broker.py`` what the broker's settings decide, ``backout.py`` the back-out store's,
``values.py`` the small validators (and :func:`exception_types`, shared with task options),
``deployment.py`` the Redis deployment (one server, Sentinel or Cluster) the URL names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..backoff import Exponential
from ..redact import masked_repr, remember_settings

# ``from_conf`` calls the validators through this module (tests patch ``config._redis_url``).
from .backout import DJANGO_STORE, backout_store_factory, backout_store_path
from .breakers import BreakerConfig, breaker_config, derived_name
from .broker import (
    _COUNTDOWN_SAFETY,
    _DEFAULT_VISIBILITY_TIMEOUT,
    MEMORY_URL,
    REDIS_SCHEMES,
    _max_countdown,
    _redis_url,
    broker_countdown_limit,
    broker_redelivery_after,
    native_delayed_delivery,
)
from .deployment import RedisDeployment, broker_options, deployment, kind_of, park_replicas
from .tracing import tracing
from .trust import (
    ErrorText,
    Keys,
    encryption_keys,
    error_text,
    pickle_signed,
    sensitive_keys,
    serializer,
    signing_keys,
)
from .values import (
    choice,
    exception_types,
    integer,
    invalid,
    optional,
    per_second,
    positive,
    string,
    task_options,
)

__all__ = [
    "DJANGO_STORE",
    "MEMORY_URL",
    "REDIS_SCHEMES",
    "SETTINGS",
    "BreakerConfig",
    "RedisDeployment",
    "RedisErrorPolicy",
    "ResilienceConfig",
    "backout_store_factory",
    "broker_countdown_limit",
    "broker_redelivery_after",
    "derived_name",
    "exception_types",
    "native_delayed_delivery",
    "task_options",
]

RedisErrorPolicy = Literal["fail_open", "fail_closed"]
#: Replays a queue may hold before the drain waits: with a 2-process worker prefetching 4 each,
#: a task sent behind a full queue waits for some 16 replays, a fraction of a second.
DEFAULT_MAX_QUEUE_DEPTH = 8
#: Seconds a claim's lease outlasts a task's hard time limit: the kill is not instant.
CLAIM_LEASE_MARGIN = 10.0
#: The longest a ``park_on`` entry waits between replays (seconds).
_PARK_ON_DELAY_CAP = 86400.0

#: Every setting read from ``app.conf`` (each prefixed ``resilience_``; Django:
#: ``CELERY_RESILIENCE_<NAME>``). The configuration reference documents exactly these.
SETTINGS = (
    "redis_url",
    "redis_options",
    "park_replicas",
    "key_prefix",
    "redis_timeout",
    "on_redis_error",
    "breakers",
    "breaker_defaults",
    "derived_shown",
    "max_countdown",
    "max_deliveries",
    "dedup_ttl",
    "dedup_lease",
    "serializer",
    "drain_batch",
    "drain_rate",
    "drain_max_queue_depth",
    "drain_slow_start",
    "replay_queue",
    "max_replays",
    "dead_ttl",
    "backout_max_entries",
    "backout_store",
    "park_on_delay",
    "keep_delay",
    "park_attempts",
    "signing_key",
    "encryption_key",
    "sensitive_keys",
    "entry_lifetime",
    "error_text",
    "tracing",
)
#: Seconds an entry's signed lifetime lasts by default (30 days).
DEFAULT_ENTRY_LIFETIME = 30 * 86400.0


@dataclass(frozen=True)
class ResilienceConfig:
    """Every ``resilience_*`` setting of one app, validated."""

    redis_url: str
    #: Passed to the Redis client (``master_name`` for Sentinel, TLS and socket options).
    redis_options: Mapping[str, Any] = field(default_factory=dict)
    #: Replicas that must hold a parked entry (``WAIT``) before its message is acked.
    park_replicas: int = 0
    key_prefix: str = "resilience"
    redis_timeout: float = 0.5
    on_redis_error: RedisErrorPolicy = "fail_open"
    breaker_defaults: BreakerConfig = field(default_factory=BreakerConfig)
    breakers: Mapping[str, BreakerConfig] = field(default_factory=dict)
    #: Derived breakers of each family that status, metrics and the admin show one by one.
    derived_shown: int = 20
    max_countdown: float = _DEFAULT_VISIBILITY_TIMEOUT * _COUNTDOWN_SAFETY
    max_deliveries: int = 3
    dedup_ttl: float = 86400.0
    #: How long a delivery of a task with ``deduplicate=True`` and no hard time limit holds
    #: its task id's claim at most (seconds).
    dedup_lease: float = 600.0
    serializer: str = "json"
    drain_batch: int = 100
    drain_rate: float = 50.0
    #: Messages a replay's queue may hold before the drain waits for room (``None``: no check).
    drain_max_queue_depth: int | None = DEFAULT_MAX_QUEUE_DEPTH
    #: Entries the first drain after a breaker closes replays; doubling from there.
    drain_slow_start: int = 2
    #: Queue every replay goes to (``None``: the entry's own queue and routing).
    replay_queue: str | None = None
    max_replays: int = 5
    dead_ttl: float | None = None
    backout_max_entries: int = 1_000_000
    #: Where parked tasks live: "redis" (default), "django" (the ORM of
    #: celery_resilience.contrib.django) or a dotted path to a factory(runtime) -> store.
    backout_store: str = "redis"
    #: Seconds before a ``park_on`` entry is due again, doubling with each replay.
    park_on_delay: float = 60.0
    #: Seconds a message waits in the broker when the store could not take it.
    keep_delay: float = 30.0
    #: Parks a task tries (the first, then its kept copies) before it gives up (FAILURE).
    park_attempts: int = 10
    #: How long the broker may hold an unacked message before it redelivers it (seconds).
    broker_redelivery_after: float = _DEFAULT_VISIBILITY_TIMEOUT
    #: Keys that sign entries (the first) and verify them (all); never in a repr.
    signing_keys: Keys = field(default=(), repr=False)
    #: AES-256 keys that encrypt entries' arguments (the first) and decrypt them (all).
    encryption_keys: Keys = field(default=(), repr=False)
    #: Argument names whose values every surface masks (admin, CLI, logs, events).
    sensitive_keys: tuple[str, ...] = ()
    #: Seconds from its park until an entry's signed lifetime ends: past it the drain no longer
    #: sends it (dead ``stale``), and it remembers a consumed entry that long.
    entry_lifetime: float = DEFAULT_ENTRY_LIFETIME
    #: What of a task's error message reaches the result backend, events and log lines.
    error_text: ErrorText = "masked"
    #: Spans and span events through OpenTelemetry's API (the ``opentelemetry`` extra).
    tracing: bool = False

    def __repr__(self) -> str:
        return masked_repr(self)

    @property
    def signing_key(self) -> list[str | bytes] | None:
        """``resilience_signing_key`` as set (``None``: entries are not signed)."""
        return list(self.signing_keys) or None

    @property
    def encryption_key(self) -> list[str | bytes] | None:
        """``resilience_encryption_key`` as set (``None``: arguments are stored in clear)."""
        return list(self.encryption_keys) or None

    @property
    def in_memory(self) -> bool:
        return self.redis_url == MEMORY_URL

    @property
    def redis_deployment(self) -> RedisDeployment:
        """The Redis deployment of the URL and options: one server, Sentinel or Cluster."""
        return deployment(self.redis_url, self.redis_options)

    @property
    def delivery_ttl(self) -> int:
        """Lifetime of a message's delivery counter: long enough to see every redelivery."""
        return int(self.broker_redelivery_after * (self.max_deliveries + 1))

    def park_on_due_in(self, replays: int) -> float:
        """When a ``park_on`` entry is due: later with each replay (the dependency keeps saying
        "not now"), so the drain does not send it back at every run."""
        cap = max(self.park_on_delay, _PARK_ON_DELAY_CAP)
        return Exponential(base=self.park_on_delay, cap=cap, jitter="equal")(replays)

    def claim_lease(self, time_limit: float | None) -> float:
        """How long a delivery holds its task id's claim (``deduplicate``): past its hard time
        limit the worker kills the body, so a little longer than that; without one,
        ``resilience_dedup_lease``."""
        if time_limit:
            return float(time_limit) + CLAIM_LEASE_MARGIN
        return self.dedup_lease

    def breaker(self, name: str) -> BreakerConfig:
        """The settings of breaker ``name``: its own entry, its base's for a derived breaker
        (``<base>:<key>``, see :meth:`family_of`), or the defaults for undeclared names."""
        cfg = self.breakers.get(name)
        if cfg is None:
            base = self.family_of(name)
            cfg = self.breaker_defaults if base is None else self.breakers[base]
        return cfg

    def family_of(self, name: str) -> str | None:
        """The declared base of a derived breaker ``<base>:<key>`` (named at call time), or
        ``None`` for a declared or undeclared plain name. The longest declared base wins."""
        if name in self.breakers or ":" not in name:
            return None
        head = name
        while ":" in head:
            head = head.rsplit(":", 1)[0]
            if head in self.breakers:
                return head
        return None

    @classmethod
    def from_app(cls, app: Any) -> ResilienceConfig:
        """Read and validate every setting of ``app`` (a Celery app)."""
        return cls.from_conf(app.conf)

    @classmethod
    def from_conf(cls, conf: Any) -> ResilienceConfig:
        """Read and validate every setting of ``conf`` (anything with ``.get(name, default)``)."""

        def get(name: str, default: Any = None) -> Any:
            assert name in SETTINGS, f"resilience_{name} is read but not listed in SETTINGS"
            return conf.get(f"resilience_{name}", default)

        remember_settings(conf)  # before any error can quote a setting

        defaults = breaker_config(
            "resilience_breaker_defaults", get("breaker_defaults", {}), BreakerConfig()
        )
        raw_breakers = get("breakers", {})
        if not isinstance(raw_breakers, Mapping):
            raise invalid("resilience_breakers", raw_breakers, "a dict of breaker name -> options")
        breakers = {}
        for name, options in raw_breakers.items():
            setting = f"resilience_breakers[{name!r}]"
            # "-" stands for "no breaker" in the back-out store; braces would break hash tags.
            if not isinstance(name, str) or name in ("", "-") or "{" in name or "}" in name:
                raise invalid("resilience_breakers", name, "a breaker name (not '-', no braces)")
            breakers[name] = breaker_config(setting, options, defaults)

        sealing = encryption_keys(get("encryption_key"))
        redis_url = _redis_url(get("redis_url"), conf.get("broker_url"))
        redis_options = get("redis_options")
        if redis_options is None and get("redis_url") is None and kind_of(redis_url) == "sentinel":
            redis_options = broker_options(conf)  # the broker's Sentinel: its master_name too
        if redis_url != MEMORY_URL:  # a malformed URL or option fails now, at start
            redis_options = dict(deployment(redis_url, redis_options).options)
        return cls(
            redis_url=redis_url,
            redis_options=redis_options or {},
            park_replicas=park_replicas(get("park_replicas", 0)),
            key_prefix=string("resilience_key_prefix", get("key_prefix", "resilience")),
            redis_timeout=positive("resilience_redis_timeout", get("redis_timeout", 0.5)),
            on_redis_error=choice(
                "resilience_on_redis_error",
                get("on_redis_error", "fail_open"),
                ("fail_open", "fail_closed"),
            ),
            breaker_defaults=defaults,
            breakers=breakers,
            max_countdown=_max_countdown(get("max_countdown"), conf),
            max_deliveries=integer("resilience_max_deliveries", get("max_deliveries", 3)),
            dedup_ttl=positive("resilience_dedup_ttl", get("dedup_ttl", 86400.0)),
            dedup_lease=positive("resilience_dedup_lease", get("dedup_lease", 600.0)),
            serializer=serializer(get("serializer"), conf.get("task_serializer")),
            drain_batch=integer("resilience_drain_batch", get("drain_batch", 100)),
            drain_rate=per_second("resilience_drain_rate", get("drain_rate", 50.0)),
            drain_max_queue_depth=optional(
                integer,
                "resilience_drain_max_queue_depth",
                get("drain_max_queue_depth", DEFAULT_MAX_QUEUE_DEPTH),
            ),
            drain_slow_start=integer("resilience_drain_slow_start", get("drain_slow_start", 2)),
            replay_queue=optional(string, "resilience_replay_queue", get("replay_queue")),
            max_replays=integer("resilience_max_replays", get("max_replays", 5)),
            dead_ttl=optional(positive, "resilience_dead_ttl", get("dead_ttl")),
            derived_shown=integer("resilience_derived_shown", get("derived_shown", 20)),
            backout_max_entries=integer(
                "resilience_backout_max_entries", get("backout_max_entries", 1_000_000)
            ),
            backout_store=backout_store_path(get("backout_store", "redis")),
            park_on_delay=positive("resilience_park_on_delay", get("park_on_delay", 60.0)),
            keep_delay=positive("resilience_keep_delay", get("keep_delay", 30.0)),
            park_attempts=integer("resilience_park_attempts", get("park_attempts", 10)),
            broker_redelivery_after=broker_redelivery_after(conf),
            signing_keys=pickle_signed(
                serializer(get("serializer"), conf.get("task_serializer")),
                signing_keys(get("signing_key")),
            ),
            encryption_keys=sealing,
            sensitive_keys=sensitive_keys(get("sensitive_keys", ())),
            entry_lifetime=positive(
                "resilience_entry_lifetime", get("entry_lifetime", DEFAULT_ENTRY_LIFETIME)
            ),
            error_text=error_text(get("error_text"), bool(sealing)),
            tracing=tracing(get("tracing", False)),
        )
