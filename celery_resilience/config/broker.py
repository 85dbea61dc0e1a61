"""What the app's broker settings decide: the Redis URL when ``resilience_redis_url`` is unset,
and how long the broker holds a message (:func:`broker_countdown_limit`, ``max_countdown``)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from ..errors import ConfigurationError
from .deployment import SENTINEL_SCHEME, kind_of
from .values import invalid, positive

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


def _redis_url(value: Any, broker_url: Any) -> str:
    if value == MEMORY_URL:
        return MEMORY_URL
    if value is None:
        broker = broker_url.split(";")[0] if isinstance(broker_url, str) else None
        if broker and urlparse(broker).scheme in REDIS_SCHEMES:
            return broker
        if broker and urlparse(broker).scheme == SENTINEL_SCHEME:
            return str(broker_url)  # kombu's list: every sentinel of it
        if broker and urlparse(broker).scheme == "memory":
            return MEMORY_URL  # an in-memory broker (tests): keep everything in the process too
        raise ConfigurationError(
            "resilience_redis_url is not set and the broker is not Redis "
            f"(broker_url={broker_url!r}): set resilience_redis_url"
        )
    if not isinstance(value, str):
        raise invalid("resilience_redis_url", value, "a redis:// URL")
    if kind_of(value) in ("sentinel", "cluster"):
        return value  # parsed by config.deployment, with resilience_redis_options
    parsed = urlparse(value)
    try:
        parsed.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError as exc:
        raise invalid("resilience_redis_url", value, "a redis:// URL") from exc
    if parsed.scheme not in REDIS_SCHEMES or not (parsed.hostname or parsed.path):
        raise invalid(
            "resilience_redis_url",
            value,
            "a redis://, rediss://, unix://, sentinel:// or redis+cluster:// URL",
        )
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
    return positive("resilience_max_countdown", value)
