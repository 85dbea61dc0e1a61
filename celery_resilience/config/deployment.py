"""Where the package's Redis is: one server, a primary watched by Redis Sentinel, or a Cluster.

``resilience_redis_url`` names it by scheme, ``resilience_redis_options`` carries what a URL
can't (the Sentinel's ``master_name``, TLS files, client options). :func:`deployment` reads both
into a :class:`RedisDeployment`, the one description the client factory (``redis_io``) builds
clients from; every malformed value is a :class:`ConfigurationError` naming its setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import unquote, urlparse

from ..errors import ConfigurationError
from ..redact import masked_repr
from .values import invalid

Kind = Literal["server", "sentinel", "cluster"]
SERVER_SCHEMES = ("redis", "rediss", "unix")
SENTINEL_SCHEME = "sentinel"
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SENTINEL_PORT = 26379
CLUSTER_PORT = 6379
#: Options only a Sentinel deployment takes (the others would be passed to a client that
#: does not know them, and fail at the first connection instead of at start).
SENTINEL_ONLY = ("master_name", "sentinel_kwargs", "min_other_sentinels")
#: Client arguments the package sets itself (from the URL, for its retry policy), or that
#: would change what its code reads (``decode_responses``).
RESERVED = (
    "retry",
    "connection_pool",
    "host",
    "port",
    "url",
    "startup_nodes",
    "path",
    "decode_responses",
)

URL_SETTING = "resilience_redis_url"
OPTIONS_SETTING = "resilience_redis_options"


@dataclass(frozen=True)
class RedisDeployment:
    """One Redis deployment: what the client factory needs to reach it."""

    kind: Kind
    #: The URL as given (a ``server`` is built from it alone; passwords stay in it).
    url: str
    #: The sentinels, or the cluster's nodes to discover it from; empty for a server.
    nodes: tuple[tuple[str, int], ...] = ()
    username: str | None = None
    password: str | None = None
    db: int = 0
    ssl: bool = False
    #: ``resilience_redis_options``: passed to the client (``master_name`` taken out of it).
    options: Mapping[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        return masked_repr(self)

    @property
    def master_name(self) -> str:
        return str(self.options["master_name"])

    def client_options(self) -> dict[str, Any]:
        """The options meant for the Redis client itself (not for the Sentinel manager)."""
        return {k: v for k, v in self.options.items() if k not in SENTINEL_ONLY}


def kind_of(url: str) -> Kind | None:
    """The kind of deployment a URL's scheme names, or ``None`` for an unknown scheme."""
    scheme = url.partition(":")[0].lower()
    if scheme in SERVER_SCHEMES:
        return "server"
    if scheme == SENTINEL_SCHEME:
        return "sentinel"
    if scheme in CLUSTER_SCHEMES:
        return "cluster"
    return None


def deployment(url: str, options: Any = None) -> RedisDeployment:
    """The deployment ``resilience_redis_url`` (``url``) and ``resilience_redis_options`` name."""
    kind = kind_of(url)
    opts = _options(options, kind)
    if kind == "sentinel":
        return _sentinel(url, opts)
    if kind == "cluster":
        return _cluster(url, opts)
    if kind == "server":
        return RedisDeployment("server", url, options=opts)
    raise invalid(
        URL_SETTING, url, "a redis://, rediss://, unix://, sentinel:// or redis+cluster:// URL"
    )


def park_replicas(value: Any) -> int:
    """``resilience_park_replicas``: how many replicas must hold an entry before its ack."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise invalid("resilience_park_replicas", value, "an integer >= 0")
    return value


def broker_options(conf: Any) -> dict[str, Any]:
    """Options of a Sentinel broker (kombu's ``broker_transport_options``) that also reach its
    primary: used when ``resilience_redis_url`` is the broker's ``sentinel://`` URL."""
    transport = conf.get("broker_transport_options") or {}
    return {k: transport[k] for k in ("master_name", "sentinel_kwargs") if k in transport}


def _options(value: Any, kind: Kind | None) -> dict[str, Any]:
    if value is None:
        value = {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise invalid(OPTIONS_SETTING, value, "a dict of client option -> value")
    options = dict(value)
    for key in RESERVED:
        if key in options:
            raise invalid(
                f"{OPTIONS_SETTING}[{key!r}]", options[key], "left out: the package sets it"
            )
    if kind == "sentinel":
        name = options.get("master_name")
        if not isinstance(name, str) or not name:
            raise ConfigurationError(
                f"{OPTIONS_SETTING}['master_name'] is required with a sentinel:// "
                f"{URL_SETTING}: the name of the primary the sentinels monitor, got {name!r}"
            )
        if not isinstance(options.get("sentinel_kwargs", {}), Mapping):
            raise invalid(
                f"{OPTIONS_SETTING}['sentinel_kwargs']", options["sentinel_kwargs"], "a dict"
            )
    elif kind is not None:
        for key in SENTINEL_ONLY:
            if key in options:
                raise invalid(
                    f"{OPTIONS_SETTING}[{key!r}]", options[key], "set only with sentinel://"
                )
    if kind == "cluster" and options.get("db", 0) != 0:
        raise invalid(f"{OPTIONS_SETTING}['db']", options["db"], "0: a cluster has one database")
    return options


def _sentinel(url: str, options: dict[str, Any]) -> RedisDeployment:
    """kombu's form: ``sentinel://[[user]:password@]host[:port][/db]``, ``;``-separated, one
    per sentinel; the first credentials and database given are those of the primary."""
    nodes: list[tuple[str, int]] = []
    username = password = None
    db: int | None = None
    for part in (p.strip() for p in url.split(";")):
        if not part:
            continue
        try:
            parsed = urlparse(part)
            port = parsed.port or SENTINEL_PORT
        except ValueError:  # its text quotes a piece of the URL: a password's, maybe
            raise invalid(URL_SETTING, url, "sentinel://host:port URLs, ';'-separated") from None
        if parsed.scheme != SENTINEL_SCHEME or not parsed.hostname:
            raise invalid(URL_SETTING, url, "sentinel://host:port URLs, ';'-separated")
        nodes.append((parsed.hostname, port))
        username = username or (unquote(parsed.username) if parsed.username else None)
        password = password or (unquote(parsed.password) if parsed.password else None)
        if db is None and parsed.path.strip("/"):
            db = _db(url, parsed.path.strip("/"))
    return RedisDeployment(
        "sentinel", url, tuple(nodes), username, password, db or 0, options=options
    )


def _cluster(url: str, options: dict[str, Any]) -> RedisDeployment:
    """``redis+cluster://[[user]:password@]host:port[,host:port...][/0]`` (``rediss+``: TLS)."""
    scheme, _, rest = url.partition("://")
    rest = rest.partition("?")[0]
    where, _, path = rest.partition("/")
    userinfo, _, hosts = where.rpartition("@")
    username, _, password = userinfo.partition(":")
    if path.strip("/") and _db(url, path.strip("/")) != 0:
        raise invalid(URL_SETTING, url, "a cluster URL without a database (a cluster has only 0)")
    nodes = [_host_port(url, h) for h in hosts.split(",") if h.strip()]
    if not nodes:
        raise invalid(URL_SETTING, url, "redis+cluster://host:port, with one node or more")
    return RedisDeployment(
        "cluster",
        url,
        tuple(nodes),
        unquote(username) or None,
        unquote(password) or None,
        0,
        ssl=scheme.lower() == "rediss+cluster",
        options=options,
    )


def _host_port(url: str, text: str) -> tuple[str, int]:
    host, _, port = text.strip().rpartition(":")
    if not host:  # no port given
        host, port = port, str(CLUSTER_PORT)
    host = host.strip("[]")  # [::1]:7000
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise invalid(URL_SETTING, url, "redis+cluster://host:port, ','-separated")
    return host, int(port)


def _db(url: str, text: str) -> int:
    if not text.isdigit():
        raise invalid(URL_SETTING, url, "a URL whose path is a database number")
    return int(text)
