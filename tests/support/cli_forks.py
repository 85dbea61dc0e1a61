"""``celery resilience`` processes without paying Celery's command line at each start.

``python -m celery`` spends some 0.6 s of CPU importing its command line (every command and
every plugin's), and the suite runs it a few hundred times. A fork server does that import once
per test process: it is a Python process of its own that imports ``celery.bin.celery`` and then
forks a child per command. The child is a real process with the command's environment, working
directory, pipes and exit code; it runs ``celery`` as ``python -m celery`` does (``runpy``), so
what the command does, prints and returns is what the test would see from a fresh process.

The server itself (``serve``, run as ``python cli_forks.py``) uses nothing but the standard
library and Celery; ``Forks`` is its client in the test process. A message to the server is one
datagram of a ``SOCK_SEQPACKET`` pair: the command as JSON, with the child's stdout, stderr and
a report pipe passed as file descriptors. The server answers with the child's pid; the child
writes its exit code to the report pipe before the interpreter's own exit (which flushes its
output and closes the pipes).

``RESILIENCE_TEST_CLI_FORKS=0`` starts every command as a fresh process instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

#: The checkout: a command's working directory.
ROOT = Path(__file__).resolve().parents[2]
#: A command's environment travels in one datagram.
MAX_MESSAGE = 1 << 20


def celery(args: list[str], env: dict[str, str]) -> subprocess.Popen[str] | Forked:
    """``python -m celery *args`` in the checkout with ``env`` added to this process's
    environment, its output in pipes (text), its stdin empty: forked from the server, or a fresh
    process where ``RESILIENCE_TEST_CLI_FORKS=0``."""
    environment = {**os.environ, **env}
    if os.environ.get("RESILIENCE_TEST_CLI_FORKS", "1") != "0":
        return Forks.start(["celery", *args], ROOT, environment)
    return subprocess.Popen(
        [sys.executable, "-m", "celery", *args],
        cwd=ROOT,
        env=environment,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# -- the client, in the test process ---------------------------------------------------------
class Forked:
    """One command's child: what ``subprocess.Popen`` gives for a command run to its end."""

    def __init__(self, pid: int, stdout: int, stderr: int, report: int) -> None:
        self.pid = pid
        self.returncode: int | Any = None  # as typeshed has Popen's: None until it ended
        self._out, self._err, self._report = stdout, stderr, report
        self._read: dict[int, list[bytes]] = {stdout: [], stderr: []}
        for fd in self._read:
            os.set_blocking(fd, False)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """The child's output once it ended (its pipes closed); ``TimeoutExpired`` past
        ``timeout``, as ``Popen.communicate``: ``kill`` then ``communicate()`` collects it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            for fd in self._read:
                selector.register(fd, selectors.EVENT_READ)
            while selector.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired("celery", timeout or 0.0)
                for key, _ in selector.select(left):
                    data = os.read(key.fd, 65536)
                    if data:
                        self._read[key.fd].append(data)
                    else:
                        selector.unregister(key.fd)
        self.returncode = self._exit_code()
        out, err = (b"".join(self._read[fd]) for fd in (self._out, self._err))
        for fd in (self._out, self._err, self._report):
            os.close(fd)
        return _text(out), _text(err)

    def _exit_code(self) -> int:
        """What the child reported, or ``-SIGKILL`` for a child that ended without a word."""
        os.set_blocking(self._report, True)
        reported = b""
        while data := os.read(self._report, 64):
            reported += data
        return int(reported) if reported else -signal.SIGKILL

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


def _text(data: bytes) -> str:
    """As ``Popen(text=True)`` reads a pipe: UTF-8 here, universal newlines."""
    return data.decode().replace("\r\n", "\n").replace("\r", "\n")


class Forks:
    """The test process's fork server, started at its first command."""

    _lock = threading.Lock()
    _server: subprocess.Popen[bytes] | None = None
    _socket: socket.socket | None = None

    @classmethod
    def start(cls, argv: list[str], cwd: Path, env: dict[str, str]) -> Forked:
        """Run ``python -m celery argv[1:]`` (``argv[0]`` is ``celery``) in a forked child."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        report_r, report_w = os.pipe()
        message = json.dumps({"argv": argv, "cwd": str(cwd), "env": env}).encode()
        try:
            with cls._lock:
                control = cls._connect(cwd)
                socket.send_fds(control, [message], [out_w, err_w, report_w])
                pid = int(control.recv(64))
        finally:
            for fd in (out_w, err_w, report_w):
                os.close(fd)
        return Forked(pid, out_r, err_r, report_r)

    @classmethod
    def _connect(cls, cwd: Path) -> socket.socket:
        if cls._socket is not None and cls._server is not None and cls._server.poll() is None:
            return cls._socket
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        cls._server = subprocess.Popen(
            [sys.executable, __file__, str(theirs.fileno())],
            cwd=cwd,
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        theirs.close()
        cls._socket = ours
        return ours

    @classmethod
    def stop(cls) -> None:
        """End the server (children running a command go on to their end)."""
        if cls._socket is not None:
            cls._socket.close()  # the server reads the end of its socket and exits
            cls._socket = None
        if cls._server is not None:
            try:
                cls._server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                cls._server.kill()
                cls._server.wait()
            cls._server = None


# -- the server ------------------------------------------------------------------------------
def serve(control: socket.socket) -> None:
    """Fork a child per command until the test process closes its end of ``control``."""
    import celery.bin.celery  # noqa: F401  (the import every child would pay)

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the children
    while True:
        message, fds, _, _ = socket.recv_fds(control, MAX_MESSAGE, 3)
        if not message:
            return
        command = json.loads(message)
        pid = os.fork()
        if pid == 0:
            control.close()
            run_child(command, *fds)  # never returns: the child exits as a process does
        for fd in fds:
            os.close(fd)
        control.send(str(pid).encode())


def run_child(command: dict[str, Any], stdout: int, stderr: int, report: int) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # a command waits for its own children
    devnull = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((devnull, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(command["env"])
    os.chdir(command["cwd"])
    sys.argv = list(command["argv"])
    import runpy

    code: object = 0
    try:
        runpy.run_module("celery", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
        raise
    except BaseException:
        code = 1  # the interpreter prints the traceback and exits with 1
        raise
    finally:
        status = 0 if code is None else code if isinstance(code, int) else 1
        os.write(report, str(status).encode())
        os.close(report)
    raise SystemExit(0)  # out of the server's loop: the child ends here


if __name__ == "__main__":
    sys.path[0] = os.getcwd()  # as ``python -m celery`` has it: the working directory first
    serve(socket.socket(fileno=int(sys.argv[1])))
