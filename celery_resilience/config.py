"""Settings: read once from ``app.conf`` (prefix ``resilience_``) into frozen, validated objects.

Defaults live here, in code, and are never written into ``app.conf``: Celery's
``add_defaults`` would take precedence over the user's own configuration.
Every invalid value raises :class:`ConfigurationError` naming the setting and the value.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, cast
from urllib.parse import urlparse

from kombu import serialization

from .backoff import Exponential
from .errors import ConfigurationError

RedisErrorPolicy = Literal["fail_open", "fail_closed"]
REDIS_SCHEMES = ("redis", "rediss", "unix")
#: ``resilience_redis_url`` value that keeps breakers and parked tasks in the process
#: (unit tests, eager mode): nothing is shared with other processes.
MEMORY_URL = "memory://"

#: Redis-broker default ``visibility_timeout`` (kombu), and RabbitMQ's default
#: ``consumer_timeout`` (an ETA message is held unacked by the worker that long at most).
_DEFAULT_VISIBILITY_TIMEOUT = 3600.0
_AMQP_CONSUMER_TIMEOUT = 1800.0
#: Share of the broker's limit a countdown may use: keeps a margin for clock skew and queueing.
_COUNTDOWN_SAFETY = 0.9
#: The longest a ``park_on`` entry waits between replays (seconds).
_PARK_ON_DELAY_CAP = 86400.0
_prepare_accept = cast(Callable[..., set[str]], serialization.prepare_accept_content)
#: Where ``resilience_backout_store = "django"`` finds its factory.
DJANGO_STORE = "celery_resilience.contrib.django.store.make_store"

T = TypeVar("T")

#: Every setting read from ``app.conf`` (each prefixed ``resilience_``; Django:
#: ``CELERY_RESILIENCE_<NAME>``). The configuration reference documents exactly these.
SETTINGS = (
    "redis_url",
    "key_prefix",
    "redis_timeout",
    "on_redis_error",
    "breakers",
    "breaker_defaults",
    "max_countdown",
    "max_deliveries",
    "dedup_ttl",
    "serializer",
    "drain_batch",
    "drain_rate",
    "max_replays",
    "dead_ttl",
    "backout_max_entries",
    "backout_store",
    "park_on_delay",
    "keep_delay",
)


@dataclass(frozen=True)
class BreakerConfig:
    """One breaker's settings; durations are seconds (float)."""

    failure_threshold: int = 5
    failure_rate_threshold: float | None = None
    minimum_calls: int = 10
    window: float = 60.0
    slow_call_seconds: float | None = None
    open_timeout: float = 30.0
    open_timeout_max: float | None = None
    half_open_max_calls: int = 1
    probe_lease: float = 60.0
    ignore: tuple[type[BaseException], ...] = ()

    @property
    def max_open_timeout(self) -> float:
        """The ceiling of the open timeout's growth on repeated trips (no growth when unset)."""
        return self.open_timeout if self.open_timeout_max is None else self.open_timeout_max


@dataclass(frozen=True)
class ResilienceConfig:
    """Every ``resilience_*`` setting of one app, validated."""

    redis_url: str
    key_prefix: str = "resilience"
    redis_timeout: float = 0.5
    on_redis_error: RedisErrorPolicy = "fail_open"
    breaker_defaults: BreakerConfig = field(default_factory=BreakerConfig)
    breakers: Mapping[str, BreakerConfig] = field(default_factory=dict)
    max_countdown: float = _DEFAULT_VISIBILITY_TIMEOUT * _COUNTDOWN_SAFETY
    max_deliveries: int = 3
    dedup_ttl: float = 86400.0
    serializer: str = "json"
    drain_batch: int = 100
    drain_rate: float = 50.0
    max_replays: int = 5
    dead_ttl: float | None = None
    backout_max_entries: int = 1_000_000
    #: Where parked tasks live: "redis" (default), "django" (the ORM of
    #: celery_resilience.contrib.django) or a dotted path to a factory(resilience) -> store.
    backout_store: str = "redis"
    #: Seconds before a ``park_on`` entry is due again, doubling with each replay.
    park_on_delay: float = 60.0
    #: Seconds a message waits in the broker when the store could not take it.
    keep_delay: float = 30.0
    #: How long the broker may hold an unacked message before it redelivers it (seconds).
    broker_redelivery_after: float = _DEFAULT_VISIBILITY_TIMEOUT

    @property
    def in_memory(self) -> bool:
        return self.redis_url == MEMORY_URL

    @property
    def delivery_ttl(self) -> int:
        """Lifetime of a message's delivery counter: long enough to see every redelivery."""
        return int(self.broker_redelivery_after * (self.max_deliveries + 1))

    def park_on_due_in(self, replays: int) -> float:
        """When a ``park_on`` entry is due: later with each replay (the dependency keeps saying
        "not now"), so the drain does not send it back at every run."""
        cap = max(self.park_on_delay, _PARK_ON_DELAY_CAP)
        return Exponential(base=self.park_on_delay, cap=cap, jitter="equal")(replays)

    def breaker(self, name: str) -> BreakerConfig:
        """The settings of breaker ``name``: its own entry, or the defaults for undeclared names."""
        return self.breakers.get(name, self.breaker_defaults)

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

        defaults = _breaker_config(
            "resilience_breaker_defaults", get("breaker_defaults", {}), BreakerConfig()
        )
        raw_breakers = get("breakers", {})
        if not isinstance(raw_breakers, Mapping):
            raise _bad("resilience_breakers", raw_breakers, "a dict of breaker name -> options")
        breakers = {}
        for name, options in raw_breakers.items():
            setting = f"resilience_breakers[{name!r}]"
            # "-" stands for "no breaker" in the back-out store; braces would break hash tags.
            if not isinstance(name, str) or name in ("", "-") or "{" in name or "}" in name:
                raise _bad("resilience_breakers", name, "a breaker name (not '-', no braces)")
            breakers[name] = _breaker_config(setting, options, defaults)

        return cls(
            redis_url=_redis_url(get("redis_url"), conf.get("broker_url")),
            key_prefix=_string("resilience_key_prefix", get("key_prefix", "resilience")),
            redis_timeout=_positive("resilience_redis_timeout", get("redis_timeout", 0.5)),
            on_redis_error=_choice(
                "resilience_on_redis_error",
                get("on_redis_error", "fail_open"),
                ("fail_open", "fail_closed"),
            ),
            breaker_defaults=defaults,
            breakers=breakers,
            max_countdown=_max_countdown(get("max_countdown"), conf),
            max_deliveries=_integer("resilience_max_deliveries", get("max_deliveries", 3)),
            dedup_ttl=_positive("resilience_dedup_ttl", get("dedup_ttl", 86400.0)),
            serializer=_serializer(
                get("serializer") or conf.get("task_serializer") or "json",
                conf.get("accept_content"),
            ),
            drain_batch=_integer("resilience_drain_batch", get("drain_batch", 100)),
            drain_rate=_positive("resilience_drain_rate", get("drain_rate", 50.0)),
            max_replays=_integer("resilience_max_replays", get("max_replays", 5)),
            dead_ttl=_optional(_positive, "resilience_dead_ttl", get("dead_ttl")),
            backout_max_entries=_integer(
                "resilience_backout_max_entries", get("backout_max_entries", 1_000_000)
            ),
            backout_store=_backout_store(get("backout_store", "redis")),
            park_on_delay=_positive("resilience_park_on_delay", get("park_on_delay", 60.0)),
            keep_delay=_positive("resilience_keep_delay", get("keep_delay", 30.0)),
            broker_redelivery_after=broker_countdown_limit(conf),
        )


def _breaker_config(setting: str, options: Any, base: BreakerConfig) -> BreakerConfig:
    if not isinstance(options, Mapping):
        raise _bad(setting, options, "a dict of breaker options")
    known = BreakerConfig.__dataclass_fields__
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ConfigurationError(
            f"{setting}: unknown option {unknown[0]!r} (known: {', '.join(sorted(known))})"
        )
    values = {name: getattr(base, name) for name in known}
    values.update(options)

    def at(option: str) -> str:
        return f"{setting}[{option!r}]"

    cfg = BreakerConfig(
        failure_threshold=_integer(at("failure_threshold"), values["failure_threshold"]),
        failure_rate_threshold=_optional(
            _rate, at("failure_rate_threshold"), values["failure_rate_threshold"]
        ),
        minimum_calls=_integer(at("minimum_calls"), values["minimum_calls"]),
        window=_positive(at("window"), values["window"]),
        slow_call_seconds=_optional(
            _positive, at("slow_call_seconds"), values["slow_call_seconds"]
        ),
        open_timeout=_positive(at("open_timeout"), values["open_timeout"]),
        open_timeout_max=_optional(_positive, at("open_timeout_max"), values["open_timeout_max"]),
        half_open_max_calls=_integer(at("half_open_max_calls"), values["half_open_max_calls"]),
        probe_lease=_positive(at("probe_lease"), values["probe_lease"]),
        ignore=_exception_types(at("ignore"), values["ignore"]),
    )
    if cfg.open_timeout_max is not None and cfg.open_timeout_max < cfg.open_timeout:
        raise _bad(
            at("open_timeout_max"), cfg.open_timeout_max, f">= open_timeout ({cfg.open_timeout})"
        )
    return cfg


def _bad(setting: str, value: Any, expected: str) -> ConfigurationError:
    return ConfigurationError(f"{setting} must be {expected}, got {value!r}")


def _integer(setting: str, value: Any) -> int:
    # bool is an int subclass; ``failure_threshold=True`` is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad(setting, value, "an integer >= 1")
    return value


def _positive(setting: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise _bad(setting, value, "a number of seconds > 0")
    if not math.isfinite(value):
        raise _bad(setting, value, "a finite number")
    return float(value)


def _rate(setting: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise _bad(setting, value, "a rate in (0, 1]")
    return float(value)


def _string(setting: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _bad(setting, value, "a non-empty string")
    return value


def _choice(setting: str, value: Any, choices: tuple[str, ...]) -> Any:
    if value not in choices:
        raise _bad(setting, value, "one of " + ", ".join(repr(c) for c in choices))
    return value


def _optional(check: Callable[[str, Any], T], setting: str, value: Any) -> T | None:
    return None if value is None else check(setting, value)


def _exception_types(setting: str, value: Any) -> tuple[type[BaseException], ...]:
    """Exception classes, or dotted paths to them (handy in Django settings)."""
    items = value if isinstance(value, (list, tuple)) else (value,)
    types: list[type[BaseException]] = []
    for item in items:
        resolved = _import_path(setting, item) if isinstance(item, str) else item
        if not (isinstance(resolved, type) and issubclass(resolved, BaseException)):
            raise _bad(setting, item, "exception classes or dotted paths to them")
        types.append(resolved)
    return tuple(types)


def _import_path(setting: str, path: str) -> Any:
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module or "builtins"), name)
    except (ImportError, AttributeError, ValueError, TypeError) as exc:  # TypeError: ".x"
        raise _bad(setting, path, "an importable dotted path") from exc


def _serializer(value: Any, accept_content: Any) -> str:
    """A serializer kombu knows, whose content type the app accepts: otherwise every parked
    entry would be written fine and come back undecodable."""
    name = _string("resilience_serializer", value)
    content_type = serialization.registry.name_to_type.get(name)
    if content_type is None:
        known = ", ".join(sorted(serialization.registry.name_to_type))
        raise _bad("resilience_serializer", name, f"a registered serializer ({known})")
    accept = ["json"] if accept_content is None else list(accept_content)
    try:
        accepted = _prepare_accept(accept)
    except Exception as exc:  # an unknown name in accept_content
        raise ConfigurationError(f"accept_content {accept!r} can't be read: {exc}") from exc
    if content_type not in accepted:
        raise ConfigurationError(
            f"resilience_serializer {name!r} is not in accept_content {accept!r}: parked tasks "
            "could not be read back. Add it to accept_content or choose another serializer."
        )
    return name


def backout_store_factory(path: str) -> Callable[..., Any]:
    """The factory named by ``resilience_backout_store`` (``"django"`` or a dotted path)."""
    dotted = DJANGO_STORE if path == "django" else path.replace(":", ".")
    module, _, name = dotted.rpartition(".")
    try:
        factory = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigurationError(
            "resilience_backout_store must be 'redis', 'django' or the dotted path of an "
            f"importable factory, got {path!r} ({type(exc).__name__}: {exc})"
        ) from exc
    if not callable(factory):
        raise _bad("resilience_backout_store", path, "the dotted path of a callable factory")
    return cast(Callable[..., Any], factory)


def _backout_store(value: Any) -> str:
    path = _string("resilience_backout_store", value)
    if path != "redis":
        backout_store_factory(path)  # fails now, naming the setting, not at the first park
    return path


def _redis_url(value: Any, broker_url: Any) -> str:
    if value == MEMORY_URL:
        return MEMORY_URL
    if value is None:
        broker = broker_url.split(";")[0] if isinstance(broker_url, str) else None
        if broker and urlparse(broker).scheme in REDIS_SCHEMES:
            return broker
        if broker and urlparse(broker).scheme == "memory":
            return MEMORY_URL  # an in-memory broker (tests): keep everything in the process too
        raise ConfigurationError(
            "resilience_redis_url is not set and the broker is not Redis "
            f"(broker_url={broker_url!r}): set resilience_redis_url"
        )
    if not isinstance(value, str):
        raise _bad("resilience_redis_url", value, "a redis:// URL")
    parsed = urlparse(value)
    try:
        parsed.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError as exc:
        raise _bad("resilience_redis_url", value, "a redis:// URL") from exc
    if parsed.scheme not in REDIS_SCHEMES or not (parsed.hostname or parsed.path):
        raise _bad("resilience_redis_url", value, "a redis://, rediss:// or unix:// URL")
    return value


def broker_countdown_limit(conf: Any) -> float:
    """The longest time the app's broker holds an ETA message safely (seconds)."""
    url = conf.get("broker_url") or ""
    scheme = urlparse(url.split(";")[0]).scheme if isinstance(url, str) else ""
    if scheme in ("amqp", "amqps", "pyamqp", "librabbitmq"):
        return _AMQP_CONSUMER_TIMEOUT
    # The shortest visibility timeout wins: the broker's, the result backend's, the top-level one.
    candidates = [
        (conf.get("broker_transport_options") or {}).get("visibility_timeout"),
        (conf.get("result_backend_transport_options") or {}).get("visibility_timeout"),
        conf.get("visibility_timeout"),
    ]
    numbers = [float(c) for c in candidates if isinstance(c, (int, float)) and c > 0]
    return min(numbers, default=_DEFAULT_VISIBILITY_TIMEOUT)


def _max_countdown(value: Any, conf: Any) -> float:
    if value is None:
        return broker_countdown_limit(conf) * _COUNTDOWN_SAFETY
    return _positive("resilience_max_countdown", value)
