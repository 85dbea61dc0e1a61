"""Running a piece of a test in a forked child (``os.fork()``, as a prefork pool makes its
processes): what a fork copies of the parent's threads, locks and connections is the point."""

from __future__ import annotations

import faulthandler
import json
import os
import tempfile
from collections.abc import Callable
from typing import Any, cast


def run_in_child(child: Callable[[], dict[str, Any]], timeout: float = 60.0) -> dict[str, Any]:
    """Fork, run ``child`` there, and return what it reported through a pipe.

    The parent waits for the child's exit, not for the pipe's end: a process that another thread
    forks meanwhile would hold the write end open. A child stuck for ``timeout`` seconds dumps
    its threads' stacks (faulthandler) and exits, and the assertion shows them.
    """
    read_end, write_end = os.pipe()
    with tempfile.TemporaryFile() as stacks:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            code = 1
            try:  # the child never returns into pytest, whatever happens
                os.close(read_end)
                faulthandler.dump_traceback_later(timeout, exit=True, file=stacks)
                try:
                    report = child()
                except BaseException as exc:
                    report = {"error": repr(exc)}
                # Written before the parent reads: a report must fit the pipe's buffer (64 KiB).
                os.write(write_end, json.dumps(report).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write_end)
        _, status = os.waitpid(pid, 0)
        os.set_blocking(read_end, False)
        with os.fdopen(read_end, "rb") as pipe:
            data = pipe.read() or b""
        stacks.seek(0)
        assert os.waitstatus_to_exitcode(status) == 0, stacks.read().decode(errors="replace")
    return cast(dict[str, Any], json.loads(data))
