"""A Redis Cluster of the test's own: primaries on free ports, slots given by ``redis-cli``.

``RedisClusterServers(3).start()`` starts three ``redis-server --cluster-enabled yes`` and
assigns the 16384 slots with ``redis-cli --cluster create ... --cluster-replicas 0``; it returns
once every node says ``cluster_state:ok``. :meth:`add_replica` gives one primary a replica.
Every process is ours (a :class:`RedisServer`), killed by its PID on ``close()``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import TracebackType

import redis

from tests.support.redis_server import RedisServer, free_port
from tests.support.waiting import wait_for

REDIS_CLI = "/usr/bin/redis-cli" if Path("/usr/bin/redis-cli").exists() else "redis-cli"
NODE_ARGS = (
    "--cluster-enabled", "yes",
    "--cluster-node-timeout", "2000",
    # A replica's first sync at once, not after the default 5 s wait for more replicas.
    "--repl-diskless-sync", "yes",
    "--repl-diskless-sync-delay", "0",
)  # fmt: skip


def cli(*args: str, timeout: float = 30.0) -> str:
    """``redis-cli`` with ``args``; its output (``CalledProcessError`` if it failed)."""
    done = subprocess.run(
        [REDIS_CLI, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
    return done.stdout


class RedisClusterServers:
    """A cluster of ``primaries`` nodes on 127.0.0.1 (and the replicas added later)."""

    def __init__(self, primaries: int = 3) -> None:
        #: Each node's cluster bus port (by its port).
        self.bus: dict[int, int] = {}
        self.primaries = [self.node() for _ in range(primaries)]
        self.replicas: list[RedisServer] = []

    def node(self) -> RedisServer:
        """A cluster node; its bus on a free port of its own (the default, port + 10000, may
        be past 65535 for the high ports the system hands out)."""
        bus = free_port()
        server = RedisServer(args=(*NODE_ARGS, "--cluster-port", str(bus)))
        self.bus[server.port] = bus
        return server

    @property
    def nodes(self) -> list[RedisServer]:
        return self.primaries + self.replicas

    def url(self, scheme: str = "redis+cluster") -> str:
        """The cluster's URL, naming two nodes (either is enough to find it)."""
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.primaries[:2])
        return f"{scheme}://{hosts}"

    def start(self) -> RedisClusterServers:
        for node in self.primaries:
            node.start()
        addresses = [f"127.0.0.1:{n.port}" for n in self.primaries]
        cli("--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes")
        for node in self.primaries:
            wait_for(lambda n=node: self._ok(n), f"cluster_state:ok on {node.port}", 30)  # type: ignore[misc]
        return self

    def _ok(self, node: RedisServer) -> bool:
        with node.client() as client:
            info = client.cluster("INFO")
        return bool(info["cluster_state"] == "ok")

    def node_id(self, node: RedisServer) -> str:
        with node.client() as client:
            return str(client.execute_command("CLUSTER", "MYID").decode())

    def owner(self, key: str) -> RedisServer:
        """The primary whose slots hold ``key``."""
        with self.primaries[0].client() as client:
            slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
            ranges = client.execute_command("CLUSTER", "SLOTS")
        for start, end, primary, *_ in ranges:
            if start <= slot <= end:
                port = int(primary[1])
                return next(n for n in self.primaries if n.port == port)
        raise AssertionError(f"no node serves slot {slot}")

    def add_replica(self, primary: RedisServer) -> RedisServer:
        """A new node that joins the cluster as ``primary``'s replica (returns once in sync)."""
        replica = self.node().start()
        self.replicas.append(replica)
        primary_id = self.node_id(primary)
        with replica.client() as client:
            meet = ("MEET", "127.0.0.1", primary.port, self.bus[primary.port])
            client.execute_command("CLUSTER", *meet)
            wait_for(
                lambda: primary_id.encode() in client.execute_command("CLUSTER", "NODES"),
                "the new node to learn of the primary",
                15,
            )
            client.execute_command("CLUSTER", "REPLICATE", primary_id)
            wait_for(
                lambda: client.info("replication").get("master_link_status") == "up",
                "the replica's link to its primary",
                15,
            )
        with primary.client() as client:
            wait_for(
                lambda: client.info("replication").get("connected_slaves") == 1,
                "the primary to count its replica",
                15,
            )
            # Counted is not yet in sync (state wait_bgsave, send_bulk): a write it acknowledged.
            wait_for(
                lambda: client.wait(1, 100) == 1,
                "the replica to acknowledge a write",
                15,
            )
        return replica

    def client(self) -> redis.RedisCluster:
        return redis.RedisCluster(host="127.0.0.1", port=self.primaries[0].port)

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def __enter__(self) -> RedisClusterServers:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
