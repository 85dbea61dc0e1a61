"""What the app's broker settings decide: the Redis URL when ``resilience_redis_url`` is unset,
how long the broker holds an unacked message (:func:`broker_redelivery_after`) and the longest
countdown it holds safely (:func:`broker_countdown_limit`, ``max_countdown``)."""

from __future__ import annotations

from importlib.util import find_spec
from typing import Any
from urllib.parse import urlparse

from ..errors import ConfigurationError
from ..redact import masked_value
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
#: The longest countdown of RabbitMQ's native delayed delivery (kombu's 28 levels of delay
#: queues, one bit of the countdown's seconds each).
NATIVE_DELAY_LIMIT = float(2**28 - 1)
_AMQP_SCHEMES = ("amqp", "amqps", "pyamqp", "librabbitmq")


def _redis_url(value: Any, broker_url: Any) -> str:
    if value == MEMORY_URL:
        return MEMORY_URL
    if value is None:
        broker = broker_url.split(";")[0] if isinstance(broker_url, str) else ""
        scheme = broker.partition("://")[0].lower()
        if scheme in REDIS_SCHEMES:
            return broker
        if scheme == SENTINEL_SCHEME:
            return str(broker_url)  # kombu's list: every sentinel of it
        if scheme == "memory":
            return MEMORY_URL  # an in-memory broker (tests): keep everything in the process too
        raise ConfigurationError(
            "resilience_redis_url is not set and the broker is not Redis "
            f"(broker_url={masked_value(broker_url)!r}): set resilience_redis_url"
        )
    if not isinstance(value, str):
        raise invalid("resilience_redis_url", value, "a redis:// URL")
    if kind_of(value) in ("sentinel", "cluster"):
        return value  # parsed by config.deployment, with resilience_redis_options
    try:
        parsed = urlparse(value)
        parsed.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:  # its text quotes a piece of the URL: a password's, maybe
        raise invalid("resilience_redis_url", value, "a redis:// URL") from None
    if parsed.scheme not in REDIS_SCHEMES or not (parsed.hostname or parsed.path):
        raise invalid(
            "resilience_redis_url",
            value,
            "a redis://, rediss://, unix://, sentinel:// or redis+cluster:// URL",
        )
    return value


def broker_countdown_limit(conf: Any) -> float:
    """The longest countdown the app's broker holds safely (seconds): the broker's own delay
    queues where Celery uses them (:func:`native_delayed_delivery`), else as long as a worker
    may hold the message unacked (:func:`broker_redelivery_after`)."""
    return NATIVE_DELAY_LIMIT if native_delayed_delivery(conf) else broker_redelivery_after(conf)


def native_delayed_delivery(conf: Any) -> bool:
    """Whether every countdown of the app waits in RabbitMQ, not in a worker: Celery 5.5's
    native delayed delivery, which Celery uses when the app has a quorum queue, for a message
    routed through a topic or fanout exchange (never a direct one). Taken as true only when
    every queue the app declares is such a quorum queue; where a countdown could go another
    way, the worker's limit stands. Before Celery 5.5 (and kombu 5.5) it is never used."""
    if _scheme(conf) not in _AMQP_SCHEMES:
        return False
    if find_spec("celery.utils.quorum_queues") is None:
        return False
    if find_spec("kombu.transport.native_delayed_delivery") is None:
        return False
    queues = _declared_queues(conf)
    return bool(queues) and all(
        kind == "quorum" and exchange in ("topic", "fanout") for kind, exchange in queues
    )


def _declared_queues(conf: Any) -> list[tuple[str, str]]:
    """(queue type, exchange type) of each queue the app declares: ``task_queues``, or the
    default queue Celery makes from the ``task_default_*`` settings."""
    declared = conf.get("task_queues")
    if not declared:
        kind = conf.get("task_default_queue_type") or "classic"
        return [(str(kind), str(conf.get("task_default_exchange_type") or "direct"))]
    queues = declared.values() if isinstance(declared, dict) else declared
    found = []
    for queue in queues:
        arguments = getattr(queue, "queue_arguments", None) or {}
        exchange = getattr(getattr(queue, "exchange", None), "type", None) or "direct"
        found.append((str(arguments.get("x-queue-type", "classic")), str(exchange)))
    return found


def _scheme(conf: Any) -> str:
    url = conf.get("broker_url") or ""
    return urlparse(url.split(";")[0]).scheme if isinstance(url, str) else ""


def broker_redelivery_after(conf: Any) -> float:
    """How long the app's broker lets a worker hold a message unacked (seconds): RabbitMQ's
    ``consumer_timeout``, or the shortest Redis ``visibility_timeout``."""
    if _scheme(conf) in _AMQP_SCHEMES:
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
