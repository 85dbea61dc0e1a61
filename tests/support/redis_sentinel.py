"""A Redis Sentinel deployment of the test's own: a primary, its replica, one sentinel.

``SentinelDeployment().start()`` starts the two servers (the replica already following the
primary, both with append-only files) and a ``redis-server --sentinel`` watching them with
quorum 1 and a short ``failover-timeout``; its ``down-after-milliseconds`` (5 s) outlasts the
stalls of a loaded 2-core host, which at 1 s made the sentinel fail over a second time, back to
a server not yet in sync. It returns once the sentinel knows the replica, so a failover can
pick it. Every process is ours (killed by PID on ``close()``); the
roles move with a failover, so :meth:`primary` asks the sentinel which server is the primary now.
"""

from __future__ import annotations

import subprocess
from types import TracebackType

import redis

from tests.support.redis_server import REDIS_SERVER, RedisServer
from tests.support.waiting import wait_for

MASTER_NAME = "resilience-primary"
#: Either server may become the primary: both start a replica's sync at once.
SERVER_ARGS = ("--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0")


class SentinelServer(RedisServer):
    """``redis-server <config> --sentinel``; the config file is the sentinel's (it rewrites it)."""

    def __init__(self, primary_port: int, down_after_ms: int, failover_timeout_ms: int) -> None:
        super().__init__()
        self.config = self.dir / "sentinel.conf"
        self.config.write_text(
            f"port {self.port}\n"
            "bind 127.0.0.1\n"
            f"dir {self.dir}\n"
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {primary_port} 1\n"
            f"sentinel down-after-milliseconds {MASTER_NAME} {down_after_ms}\n"
            f"sentinel failover-timeout {MASTER_NAME} {failover_timeout_ms}\n"
            f"sentinel parallel-syncs {MASTER_NAME} 1\n"
        )

    def start(self, timeout: float = 10.0) -> SentinelServer:
        with open(self.dir / "redis.log", "ab") as log:
            self.process = subprocess.Popen(
                [REDIS_SERVER, str(self.config), "--sentinel"],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._wait_for_ping(timeout)
        return self


class SentinelDeployment:
    """A primary, one replica and one sentinel on 127.0.0.1."""

    def __init__(
        self, down_after_ms: int = 5000, failover_timeout_ms: int = 3000, appendonly: bool = True
    ) -> None:
        # Persistence, as a primary that a supervisor restarts needs: restarted empty, a server
        # the sentinel makes primary again (a failover back, on a stall of the new primary)
        # would hand its empty data set to its replica.
        first = RedisServer(appendonly=appendonly, args=SERVER_ARGS)
        replica_of = ["--replicaof", "127.0.0.1", str(first.port)]
        self.servers = [first, RedisServer(appendonly=appendonly, args=[*SERVER_ARGS, *replica_of])]
        self.sentinel = SentinelServer(first.port, down_after_ms, failover_timeout_ms)

    @property
    def url(self) -> str:
        """kombu's form, as ``resilience_redis_url`` takes it."""
        return f"sentinel://127.0.0.1:{self.sentinel.port}"

    def start(self) -> SentinelDeployment:
        for server in self.servers:
            server.start()
        self.sentinel.start()
        # The sentinel reads a replica's INFO every 10 s: the replica's link may read "err" at
        # its first look (its sync not yet done) and "ok" only at a later one, on a loaded host
        # two or three periods later.
        wait_for(self._replica_known, "the sentinel to know the replica", 45)
        wait_for(self._replica_in_sync, "the replica to acknowledge a write", 20)
        return self

    def _replica_in_sync(self) -> bool:
        """A write on the primary that a replica holds within a second (its first sync done)."""
        with self.primary().client() as client, client.pipeline(transaction=False) as pipe:
            pipe.set("sentinel-deployment:sync-check", "1")
            pipe.execute_command("WAIT", 1, 1000)
            _, acknowledged = pipe.execute()
        return int(acknowledged) >= 1

    def sentinel_client(self) -> redis.Redis:
        return self.sentinel.client(socket_timeout=2.0, decode_responses=True)

    def _replica_known(self) -> bool:
        with self.sentinel_client() as client:
            replicas = client.execute_command("SENTINEL", "REPLICAS", MASTER_NAME)
        # redis-py parses the reply into dicts from 6.1 on; 6.0 gives each as a flat list.
        parsed = [
            r if isinstance(r, dict) else dict(zip(r[::2], r[1::2], strict=True)) for r in replicas
        ]
        return any(
            "s_down" not in r["flags"] and r.get("master-link-status") == "ok" for r in parsed
        )

    def primary_port(self) -> int:
        with self.sentinel_client() as client:
            _, port = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME)
        return int(port)

    def server(self, port: int) -> RedisServer:
        return next(s for s in self.servers if s.port == port)

    def primary(self) -> RedisServer:
        """The server the sentinel names as primary now."""
        return self.server(self.primary_port())

    def failover(self) -> None:
        """``SENTINEL FAILOVER``: the sentinel promotes the replica now (no agreement needed)."""
        with self.sentinel_client() as client:
            client.execute_command("SENTINEL", "FAILOVER", MASTER_NAME)

    def failovers(self) -> int:
        """Failovers the sentinel completed so far (``+switch-master`` in its log)."""
        return self.sentinel.log().count("+switch-master")

    def processes(self) -> list[RedisServer]:
        return [self.sentinel, *self.servers]

    def close(self) -> None:
        for process in self.processes():
            process.close()

    def __enter__(self) -> SentinelDeployment:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
