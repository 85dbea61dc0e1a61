"""A failure that repeats is logged once per cause, not once per task, and its end is logged too.

When the store refuses every park, a thousand tasks a second would otherwise write a thousand
identical tracebacks. The cause is the exception's type: the first failure of each cause is
logged at ERROR with the error and its traceback, later ones at DEBUG, and the first success
afterwards says how many failed meanwhile.
"""

from __future__ import annotations

import logging
import threading


class TroubleLog:
    """Once-per-cause logging of one kind of failure (``what``: "parking", "publishing a retry")."""

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self.logger = logger
        self.what = what
        self._causes: set[str] = set()
        self._failures = 0
        self._lock = threading.Lock()

    def failed(self, exc: BaseException, message: str, *args: object) -> None:
        """Log ``message`` (what happened to the task) with ``exc``: at ERROR once per cause."""
        cause = f"{type(exc).__module__}.{type(exc).__qualname__}"
        with self._lock:
            first = cause not in self._causes
            self._causes.add(cause)
            self._failures += 1
        if first:
            self.logger.error(
                message + ": %s: %s (further %s failures of this kind are logged at DEBUG)",
                *args,
                type(exc).__name__,
                exc,
                self.what,
                exc_info=exc,
            )
        else:
            self.logger.debug(message + ": %s: %s", *args, type(exc).__name__, exc)

    def ok(self) -> None:
        """Things work again: say so once, with how many failed meanwhile."""
        if not self._failures:
            return
        with self._lock:
            failures, self._failures = self._failures, 0
            self._causes.clear()
        if failures:
            what = self.what[:1].upper() + self.what[1:]
            self.logger.warning("%s works again after %d failure(s)", what, failures)
