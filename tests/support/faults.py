"""Real faults for the fault matrix: a TCP proxy that holds, drops or cuts traffic, and the Redis
settings that make a live server answer errors (NOPERM through an ACL, OOM through maxmemory,
READONLY through REPLICAOF).

The proxy sits between a client (a worker, a drainer) and a real ``redis-server``. It forwards
bytes unchanged until the test tells it otherwise:

- ``blackhole()``: nothing is forwarded either way, connections stay open (a hung server or a
  lost network: clients wait for their socket timeout);
- ``hold_on(pattern)``: forwards until a client sends a chunk containing ``pattern`` (a Lua
  script's SHA, a key name), then holds that chunk and everything after it on that connection:
  the client is stuck at exactly that step, the others go on, while the test acts (``kill -9``
  of the process, a Redis fault), then ``release()``;
- ``cut_reply_on(pattern)``: forwards the matching request, swallows the server's answer and
  closes the client's connection: the command ran, the client sees a connection error;
- ``reset()``: closes every connection.
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from celery_resilience.redis_io import script_source

from .redis_server import free_port

_CHUNK = 65536


@dataclass
class _Link:
    client: socket.socket
    server: socket.socket
    held: list[bytes] = field(default_factory=list)  # client -> server chunks not yet sent
    holding: bool = False  # this connection is held at a matched step
    cut_after_request: bool = False
    closed: bool = False


class FaultProxy:
    """A TCP proxy on 127.0.0.1 in front of ``target_port``, steered by the test."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._lock = threading.Condition()
        self._links: list[_Link] = []
        self._blackhole = False
        self._hold: tuple[bytes, ...] | None = None
        self._cut: bytes | None = None
        self.matched = threading.Event()  # a held or cut pattern was seen
        self._running = True
        threading.Thread(target=self._accept, daemon=True, name="fault-proxy").start()

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    # -- steering ----------------------------------------------------------------------------
    def blackhole(self) -> None:
        with self._lock:
            self._blackhole = True

    def hold_on(self, *patterns: bytes) -> threading.Event:
        """Hold the first client chunk containing every one of ``patterns`` (and its connection
        after it)."""
        with self._lock:
            self.matched.clear()
            self._hold = patterns
        return self.matched

    def cut_reply_on(self, pattern: bytes) -> threading.Event:
        """Let the next request containing ``pattern`` run, but never deliver its reply."""
        with self._lock:
            self.matched.clear()
            self._cut = pattern
        return self.matched

    def release(self) -> None:
        """Back to forwarding; what was held is sent on (to clients that are still there)."""
        with self._lock:
            self._blackhole, self._hold, self._cut = False, None, None
            links = list(self._links)
            for link in links:
                link.holding = False
            self._lock.notify_all()
        for link in links:
            self._flush(link)

    def reset(self) -> None:
        """Close every connection (as a restarted server or a network cut would)."""
        with self._lock:
            links, self._links = list(self._links), []
            self._blackhole, self._hold, self._cut = False, None, None
            self._lock.notify_all()
        for link in links:
            self._close(link)

    def close(self) -> None:
        self._running = False
        with contextlib.suppress(OSError):
            self._listener.close()
        self.reset()

    # -- plumbing ------------------------------------------------------------------------------
    def _accept(self) -> None:
        while self._running:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            link = _Link(client, server)
            with self._lock:
                self._links.append(link)
            threading.Thread(target=self._upstream, args=(link,), daemon=True).start()
            threading.Thread(target=self._downstream, args=(link,), daemon=True).start()

    def _upstream(self, link: _Link) -> None:
        """Client -> server, where holds and cuts are decided."""
        while True:
            try:
                data = link.client.recv(_CHUNK)
            except OSError:
                data = b""
            if not data:
                self._close(link)
                return
            with self._lock:
                if self._hold is not None and all(p in data for p in self._hold):
                    self._hold = None
                    link.holding = True
                    self.matched.set()
                elif self._cut is not None and self._cut in data:
                    self._cut = None
                    link.cut_after_request = True
                    self.matched.set()
                if self._blackhole or link.holding or link.held:
                    link.held.append(data)
                    continue
            try:
                link.server.sendall(data)
            except OSError:
                self._close(link)
                return

    def _downstream(self, link: _Link) -> None:
        """Server -> client; held back while blackholed, dropped after a cut."""
        while True:
            try:
                data = link.server.recv(_CHUNK)
            except OSError:
                data = b""
            if not data:
                self._close(link)
                return
            with self._lock:
                while (self._blackhole or link.holding) and not link.closed:
                    self._lock.wait(0.05)
                if link.cut_after_request:
                    break
            try:
                link.client.sendall(data)
            except OSError:
                self._close(link)
                return
        self._close(link)  # the reply is lost: the client sees its connection closed

    def _flush(self, link: _Link) -> None:
        # A client killed while held never sent its request as far as the server: the thread
        # reading it may not have seen the end of its stream yet, so look before sending on.
        if link.held and _peer_gone(link.client):
            self._close(link)
            return
        # Under the lock: a chunk the client sends meanwhile must not overtake the held ones.
        with self._lock:
            held, link.held = link.held, []
            try:
                for data in held:
                    link.server.sendall(data)
            except OSError:
                pass
            else:
                return
        self._close(link)

    def _close(self, link: _Link) -> None:
        with self._lock:
            if link.closed:
                return
            link.closed = True
            if link in self._links:
                self._links.remove(link)
            self._lock.notify_all()
        for sock in (link.client, link.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


def script_sha(path: str) -> bytes:
    """The SHA1 Redis knows a package script by (what EVALSHA carries), as bytes.

    ``path`` is relative to the package, e.g. ``backout/redis/lua/park.lua``; with the prelude and
    head it is loaded with (``redis_io.script_source``).
    """
    folder, name = path.removesuffix(".lua").split("/lua/")
    text = script_source("celery_resilience." + folder.replace("/", "."), name)
    return hashlib.sha1(text.encode()).hexdigest().encode()


# -- Redis answering errors --------------------------------------------------------------------


@contextlib.contextmanager
def acl_denied(admin: redis.Redis, user: str, rules: list[str]) -> Iterator[None]:
    """Apply ACL ``rules`` to ``user`` (NOPERM for what they forbid), and give back all after."""
    command(admin, "ACL", "SETUSER", user, *rules)
    try:
        yield
    finally:
        command(admin, "ACL", "SETUSER", user, "allkeys", "allchannels", "+@all")


def make_user(admin: redis.Redis, user: str, password: str) -> None:
    """A user that may do everything, until a test takes some of it away."""
    command(admin, "ACL", "SETUSER", user, "on", f">{password}", "allkeys", "allchannels", "+@all")


def command(admin: redis.Redis, *args: str) -> Any:
    """``admin.execute_command(*args)``, which redis-py leaves untyped."""
    return cast(Any, admin).execute_command(*args)  # redis-py's annotations vary by release


@contextlib.contextmanager
def out_of_memory(admin: redis.Redis) -> Iterator[None]:
    """Every write answers OOM (maxmemory below what is used, nothing may be evicted)."""
    before = cast(str, admin.config_get("maxmemory")["maxmemory"])
    policy = cast(str, admin.config_get("maxmemory-policy")["maxmemory-policy"])
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", 1)
    try:
        yield
    finally:
        admin.config_set("maxmemory", before)
        admin.config_set("maxmemory-policy", policy)


@contextlib.contextmanager
def read_only(admin: redis.Redis) -> Iterator[None]:
    """Every write answers READONLY: the server becomes a replica of a primary that is not
    there (it keeps its data until a sync, which never comes), as after a failover."""
    command(admin, "REPLICAOF", "127.0.0.1", str(free_port()))
    try:
        yield
    finally:
        command(admin, "REPLICAOF", "NO", "ONE")


def _peer_gone(sock: socket.socket) -> bool:
    """Whether the other end closed ``sock`` (an end of stream is waiting to be read)."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
