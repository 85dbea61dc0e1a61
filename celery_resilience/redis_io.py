"""How the package talks to Redis: its clients, its Lua scripts, its errors and its clock.

One of each, shared by the breaker store, the back-out store, the drain lock and the runtime:
- :func:`make_client`: a client that gives up within ``resilience_redis_timeout``;
- :func:`load_script`: a script from a package's ``lua/`` folder, with its prelude;
- :func:`unavailable`: Redis trouble becomes :class:`StoreUnavailable`, the one error callers
  catch (a Redis out of memory, read-only after a failover or refusing a command can't do the
  work either: the caller keeps the task in the broker, as when Redis is down);
- :func:`redis_time`: Redis ``TIME``, the fleet's one clock, in epoch seconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .errors import StoreUnavailable

#: The shared prelude a script folder may hold, loaded before each of its scripts.
PRELUDE = "_common.lua"


def make_client(url: str, timeout: float, retry: bool = True) -> redis.Redis:
    """A client that gives up within ``timeout`` seconds instead of redis-py's defaults.

    With ``retry``, one retry without backoff lets a pooled connection that Redis closed (a
    restart) reconnect at once: for reads and for writes that may safely run twice (a park is
    idempotent on its entry id). Without it, a command is sent once: the breaker's scripts count
    and grant probes, and one whose reply was lost may have run, so sending it again could
    count a failure twice or grant one probe too many. Timeouts are never retried.
    """
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=timeout,
        socket_timeout=timeout,
        retry=Retry(NoBackoff(), 1 if retry else 0, supported_errors=(redis.ConnectionError,)),
        # No health check: its PING has a retry of its own, which made a hanging Redis cost
        # four timeouts per call instead of two; the retry above handles a stale connection.
        health_check_interval=0,
    )


def script_source(package: str, name: str) -> str:
    """``<name>_head.lua`` (a fast path, if any), the prelude (if any), then ``<name>.lua``."""
    folder = resources.files(package).joinpath("lua")
    parts = []
    for part in (f"{name}_head.lua", PRELUDE):
        path = folder.joinpath(part)
        if path.is_file():
            parts.append(path.read_text())
    parts.append(folder.joinpath(f"{name}.lua").read_text())
    return "\n".join(parts)


def load_script(client: redis.Redis, package: str, name: str) -> Any:
    """The script ``name`` of ``package`` registered on ``client`` (EVALSHA, loaded on demand)."""
    return client.register_script(script_source(package, name))


@contextmanager
def unavailable(what: str) -> Iterator[None]:
    """Turn any Redis error raised inside into ``StoreUnavailable("<what> unavailable: ...")``."""
    try:
        yield
    except redis.RedisError as exc:
        raise StoreUnavailable(f"{what} unavailable: {exc}") from exc


def redis_time(client: redis.Redis) -> float:
    """Redis ``TIME`` in epoch seconds (raises ``redis.RedisError`` when Redis can't answer)."""
    seconds, micros = client.time()
    return float(seconds) + micros / 1_000_000
