"""Waiting for a condition, the suite's one way: a deadline, never a pause.

``wait_for`` returns as soon as the condition holds, so a deadline far above what a quiet host
needs costs nothing there and holds on a loaded one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal, TypeVar

T = TypeVar("T")

#: Seconds a condition gets by default: many times what it takes on a quiet host.
TIMEOUT = 20.0


def wait_for(
    predicate: Callable[[], T | Literal[False] | None],
    what: str,
    timeout: float = TIMEOUT,
    poll: float = 0.01,
) -> T:
    """Poll ``predicate`` until it returns something true, and return that; ``AssertionError``
    naming ``what`` (and the last value) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what} ({value!r})")
        time.sleep(poll)
