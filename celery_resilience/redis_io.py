"""How the package talks to Redis: its clients, its Lua scripts, its errors and its clock.

One of each, shared by the breaker store, the back-out store, the drain lock and the runtime:
- :func:`make_client`: a client of one server, of the primary Redis Sentinel names, or of a
  Redis Cluster, that gives up within ``resilience_redis_timeout``;
- :func:`load_script`: a script from a package's ``lua/`` folder, with its prelude;
- :func:`unavailable`: Redis trouble becomes :class:`StoreUnavailable`, the one error callers
  catch (a Redis out of memory, read-only after a failover or refusing a command can't do the
  work either: the caller keeps the task in the broker, as when Redis is down);
- :func:`redis_time`: Redis ``TIME``, the fleet's one clock, in epoch seconds;
- :func:`call_replicated`: a script that returns only once replicas hold what it wrote.

A cluster client is typed as ``redis.Redis``: it answers every command the package sends (each
script's keys share one hash tag, so one slot); :func:`node_client` and :func:`primaries` give
the plain clients of its nodes where a command must reach a given one, :func:`database` the
database number its commands run in (0 on a cluster).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from importlib import resources
from typing import Any, cast

import redis
from redis._parsers import Encoder
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.commands.core import Script
from redis.exceptions import AskError, NoPermissionError, RedisClusterException
from redis.retry import Retry
from redis.sentinel import Sentinel

from .config import RedisDeployment
from .config.deployment import deployment
from .errors import AccessDenied, NotReplicated, StoreUnavailable

#: The shared prelude a script folder may hold, loaded before each of its scripts.
PRELUDE = "_common.lua"

# redis-py annotates more of itself with each release (``Sentinel`` from 8.2): what it may or may
# not annotate is called through a name of a stated type, so that neither an annotation added
# nor one removed changes what the type checker sees.
_Sentinel: Callable[..., Any] = Sentinel
_ClusterNode: Callable[..., Any] = ClusterNode
_Encoder: Callable[..., Encoder] = Encoder


def make_client(where: RedisDeployment | str, timeout: float, retry: bool = True) -> redis.Redis:
    """A client that gives up within ``timeout`` seconds instead of redis-py's defaults.

    ``where`` is a deployment (or a ``redis://`` URL): one server, the primary its sentinels
    name (found again after a failover), or a cluster. With ``retry``, one retry without
    backoff lets a pooled connection that Redis closed (a restart, a failover) reconnect at
    once: for reads and for writes that may safely run twice (a park is idempotent on its entry
    id). Without it, a command is sent once: the breaker's scripts count and grant probes, and
    one whose reply was lost may have run, so sending it again could count a failure twice or
    grant one probe too many. Timeouts are never retried on one server or a Sentinel's primary.
    On a Sentinel, finding the primary asks each sentinel once per connection attempt: a
    stalled sentinel costs a command a few ``timeout``s, never redis-py's retries.
    """
    target = where if isinstance(where, RedisDeployment) else deployment(where)
    attempts = Retry(NoBackoff(), 1 if retry else 0, supported_errors=(redis.ConnectionError,))
    common: dict[str, Any] = {
        "socket_connect_timeout": timeout,
        "socket_timeout": timeout,
        # No health check: its PING has a retry of its own, which made a hanging Redis cost
        # four timeouts per call instead of two; the retry above handles a stale connection.
        "health_check_interval": 0,
    }
    options = {**common, **target.client_options()}
    if target.kind == "cluster":
        return cast(redis.Redis, LazyCluster(target, options, attempts))
    if target.kind == "sentinel":
        sentinel_kwargs: dict[str, Any] = {
            k: v for k, v in common.items() if k.startswith("socket_")
        }
        # Each sentinel asked once per discovery, which moves on to the next sentinel by itself:
        # with redis-py's default retry (10 tries, backoff up to 1 s, the sentinels' clients'
        # own before redis-py 8.2), a stalled sentinel held every connection attempt for ~19 s.
        sentinel_kwargs["retry"] = Retry(NoBackoff(), 0)
        sentinel_kwargs.update(target.options.get("sentinel_kwargs") or {})
        sentinel = _Sentinel(
            list(target.nodes),
            sentinel_kwargs=sentinel_kwargs,
            min_other_sentinels=target.options.get("min_other_sentinels", 0),
        )
        primary = {"username": target.username, "password": target.password, "db": target.db}
        master = sentinel.master_for(target.master_name, retry=attempts, **{**primary, **options})
        return cast(redis.Redis, master)
    return redis.Redis.from_url(target.url, retry=attempts, **options)


@contextmanager
def _cluster_errors() -> Iterator[None]:
    """The cluster client's own errors (no node reachable, a slot no node serves) are not
    ``RedisError``s: made ``ConnectionError``s, they are handled as any unreachable Redis."""
    try:
        yield
    except RedisClusterException as exc:
        raise redis.ConnectionError(f"Redis Cluster unavailable: {exc}") from exc


class _Cluster(RedisCluster):
    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        with _cluster_errors():
            return cast(Any, super()).execute_command(*args, **kwargs)

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> Any:
        pipe = cast(Any, super()).pipeline(transaction, shard_hint)
        pipe.__class__ = _Pipeline  # the same object; only its execute translates errors
        return pipe


class _Pipeline(ClusterPipeline):
    def execute(self, raise_on_error: bool = True) -> list[Any]:
        with _cluster_errors():
            return super().execute(raise_on_error)


class LazyCluster:
    """A Redis Cluster client made on first use, and made again until it could be.

    ``RedisCluster`` asks the nodes for the slot map as it is made: a cluster unreachable when
    a worker starts would fail there, outside the code that handles an unreachable Redis. Made
    at the first command instead, its absence is a ``redis.ConnectionError`` like any other.
    """

    def __init__(self, target: RedisDeployment, options: dict[str, Any], retry: Retry) -> None:
        nodes = [_ClusterNode(h, p) for h, p in target.nodes]
        credentials = {"username": target.username, "password": target.password}
        kwargs = {**credentials, "ssl": target.ssl, **options}
        self._make: Callable[[], RedisCluster] = lambda: _Cluster(
            startup_nodes=nodes, retry=retry, **kwargs
        )
        self._cluster: RedisCluster | None = None
        self._lock = threading.Lock()

    @property
    def cluster(self) -> RedisCluster:
        if self._cluster is None:
            with self._lock, _cluster_errors():
                if self._cluster is None:
                    self._cluster = self._make()
        return self._cluster

    def get_encoder(self) -> Encoder:
        """What a ``Script`` hashes its source with, before any node was asked anything."""
        return _Encoder("utf-8", "strict", False)

    def register_script(self, script: str) -> Script:
        return Script(cast(Any, self), script)

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cluster, name)


def database(client: redis.Redis) -> int:
    """The database number the client's commands run in (a cluster has only 0)."""
    if isinstance(client, LazyCluster):
        return 0
    return int(client.get_connection_kwargs().get("db") or 0)


def node_client(client: redis.Redis, key: str) -> redis.Redis:
    """The client of the node that holds ``key`` on a cluster; ``client`` itself otherwise."""
    if not isinstance(client, LazyCluster):
        return client
    with _cluster_errors():
        cluster = client.cluster
        return cast(redis.Redis, cluster.get_redis_connection(cluster.get_node_from_key(key)))


def primaries(client: redis.Redis) -> list[redis.Redis]:
    """One client per primary: every node of a cluster, else ``client`` (settings checks)."""
    if not isinstance(client, LazyCluster):
        return [client]
    with _cluster_errors():
        cluster = client.cluster
        return [cast(redis.Redis, cluster.get_redis_connection(n)) for n in cluster.get_primaries()]


def script_source(package: str, name: str, prelude: bool = True) -> str:
    """``<name>_head.lua`` (a fast path, if any), the prelude (if any and asked for), then
    ``<name>.lua``."""
    folder = resources.files(package).joinpath("lua")
    parts = []
    for part in (f"{name}_head.lua", PRELUDE) if prelude else ():
        path = folder.joinpath(part)
        if path.is_file():
            parts.append(path.read_text())
    parts.append(folder.joinpath(f"{name}.lua").read_text())
    return "\n".join(parts)


def load_script(client: redis.Redis, package: str, name: str, prelude: bool = True) -> Any:
    """The script ``name`` of ``package`` registered on ``client`` (EVALSHA, loaded on demand);
    ``prelude=False`` for a script of the folder that does not share its prelude."""
    return client.register_script(script_source(package, name, prelude))


def call_replicated(
    client: redis.Redis,
    script: Any,
    keys: Sequence[str],
    args: Sequence[Any],
    replicas: int,
    timeout: float,
) -> Any:
    """Run ``script``, then ``WAIT replicas timeout``: its reply once ``replicas`` replicas hold
    what it wrote, else :class:`NotReplicated` (what it wrote is on the primary, maybe alone).

    ``WAIT`` counts the writes of its own connection only, so both go in one pipeline, on one
    connection: on a cluster, to the node that owns the slot of ``keys``.
    """
    node = node_client(client, keys[0])
    try:
        with node.pipeline(transaction=False) as pipe:
            script(keys, args, client=pipe)
            wait = ("WAIT", replicas, max(1, round(timeout * 1000)))
            cast(Any, pipe).execute_command(*wait)
            reply, acknowledged = pipe.execute()
    except AskError:  # MOVED or ASK: the slot has moved; read the slot map before the next try
        if isinstance(client, LazyCluster):
            with contextlib.suppress(redis.RedisError, RedisClusterException):
                client.cluster.nodes_manager.initialize()
        raise
    if int(acknowledged) < replicas:
        raise NotReplicated(
            f"back-out store unavailable: {acknowledged} of {replicas} replicas held the entry "
            f"within {timeout:g}s",
            reply,
        )
    return reply


@contextmanager
def unavailable(what: str) -> Iterator[None]:
    """Turn any Redis error raised inside into ``StoreUnavailable("<what> unavailable: ...")``;
    a command refused to this process's Redis user into :class:`AccessDenied`."""
    try:
        yield
    except NoPermissionError as exc:
        raise AccessDenied(f"{what}: Redis refused this process's user (NOPERM): {exc}") from exc
    except (redis.RedisError, RedisClusterException) as exc:
        raise StoreUnavailable(f"{what} unavailable: {exc}") from exc


def redis_time(client: redis.Redis, key: str | None = None) -> float:
    """Redis ``TIME`` in epoch seconds (raises ``redis.RedisError`` when Redis can't answer); on
    a cluster, the clock of the node holding ``key``, the one its scripts read."""
    target = client if key is None else node_client(client, key)
    seconds, micros = target.time()
    return float(seconds) + micros / 1_000_000
