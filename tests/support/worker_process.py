"""Start and stop real ``celery worker`` subprocesses that load ``tests.apps.workerapp``.

Every process is ours and is signalled by its PID only. The worker's output goes to a log file;
:meth:`WorkerProcess.stop` returns it so a test can print it (pytest shows it on failure).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from celery_resilience.breaker import Breaker
from celery_resilience.breaker.knowledge import MAX_KNOWLEDGE_AGE

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0


def force_open_for_workers(breaker: Breaker) -> None:
    """Force ``breaker`` open, then wait out the staleness bound: until then a running worker
    that saw it closed may admit a task sent at once without asking Redis (its feed brings the
    change within milliseconds, but a loaded host can run the task first)."""
    breaker.force_open()
    time.sleep(MAX_KNOWLEDGE_AGE)


def spawn(
    command: Sequence[str], env: Mapping[str, str], log_path: Path
) -> subprocess.Popen[bytes]:
    """Start ``command`` from the repository's root, its output appended to ``log_path``."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(command),
            cwd=ROOT,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C of pytest is not sent to the process too
        )


class WorkerProcess:
    """One ``celery -A tests.apps.workerapp worker`` with its own environment and log file."""

    def __init__(
        self,
        env: Mapping[str, str],
        log_path: Path,
        pool: str = "solo",
        concurrency: int = 1,
        app: str = "tests.apps.workerapp",
        options: Sequence[str] = (),
    ) -> None:
        self.env = {**os.environ, **env}
        self.log_path = log_path
        self.pool = pool
        self.concurrency = concurrency
        self.app = app
        self.options = list(options)  # more of the worker's command line (``--time-limit 30``)
        self.queue = env["WORKERAPP_QUEUE"]
        self.hostname = f"w{uuid.uuid4().hex[:8]}@%h"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def command(self) -> list[str]:
        """The worker's command line (a subclass adds options)."""
        return [
            sys.executable, "-m", "celery", "-A", self.app, "worker",
            "-P", self.pool, "-c", str(self.concurrency), "-Q", self.queue, "-n", self.hostname,
            "--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "info",
            *self.options,
        ]  # fmt: skip

    def start(self, timeout: float = READY_TIMEOUT) -> WorkerProcess:
        self.process = spawn(self.command(), self.env, self.log_path)
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float) -> None:
        """Wait for the worker's "<hostname> ready." line (its consumer is running)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if " ready." in self.log():
                if self.pool == "prefork":
                    self._wait_children(deadline)
                return
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"worker exited with {self.process.returncode}:\n{self.log()}")
            time.sleep(0.05)
        raise TimeoutError(f"worker not ready after {timeout}s:\n{self.log()}")

    def _wait_children(self, deadline: float) -> None:
        while len(self.children()) < self.concurrency and time.monotonic() < deadline:
            time.sleep(0.05)

    def children(self) -> list[int]:
        """PIDs of the worker's direct children (prefork pool processes), from ``/proc``."""
        pids: set[int] = set()
        for task_dir in Path(f"/proc/{self.pid}/task").glob("*"):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in (task_dir / "children").read_text().split())
        return sorted(pids)

    def kill_child(self, pid: int) -> None:
        """SIGKILL one pool child, by PID, after checking that it is one of ours."""
        if pid not in self.children():
            raise ValueError(f"{pid} is not a child of worker {self.pid}")
        os.kill(pid, signal.SIGKILL)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = STOP_TIMEOUT) -> str:
        """Warm shutdown (SIGTERM), SIGKILL by PID if it hangs; returns the log."""
        process = self.process
        if process is None or process.poll() is not None:
            return self.log()
        children = {pid: start_time(pid) for pid in self.children()}
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)
            # Pool children outlive a SIGKILLed parent: end them too, by PID, checking that
            # each PID still names the same process (its start time) before signalling it.
            for pid, started in children.items():
                if started is not None and start_time(pid) == started:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        return self.log()


def proc_stat(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` after the command's name: state, ppid, ... (``None``: gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks (``/proc/<pid>/stat`` field 22), or ``None``."""
    stat = proc_stat(pid)
    return None if stat is None else int(stat[19])


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has closed its files: it does not)."""
    stat = proc_stat(pid)
    return stat is not None and stat[0] != "Z"
