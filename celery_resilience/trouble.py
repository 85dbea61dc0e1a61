"""A failure that repeats is logged once per cause, not once per task, and its end is logged too.

When the store refuses every park, a thousand tasks a second would otherwise write a thousand
identical tracebacks. The cause is the exception's type: the first failure of each cause is
logged at ERROR with the error and its traceback, later ones at DEBUG, and the first success
afterwards says how many failed meanwhile. With ``by_cause=False`` the first failure of an outage
is the one, whatever its cause; :meth:`TroubleLog.first` and :meth:`TroubleLog.recovered` give
that bookkeeping to a caller with log lines of its own (the breakers' Redis outage).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref

#: Every TroubleLog of the process, for :func:`_forked`.
_every: weakref.WeakSet[TroubleLog] = weakref.WeakSet()


def _forked() -> None:
    # A fork copies a lock as the parent's threads left it: one held at that instant by another
    # thread would stay held in the child, and its first failure would wait forever.
    for log in list(_every):
        log._lock = threading.Lock()


os.register_at_fork(after_in_child=_forked)


class TroubleLog:
    """Once-per-cause logging of one kind of failure (``what``: "parking", "publishing a retry")."""

    def __init__(self, logger: logging.Logger, what: str, by_cause: bool = True) -> None:
        self.logger = logger
        self.what = what
        self.by_cause = by_cause
        self._causes: set[str] = set()
        self._failures = 0
        self._lock = threading.Lock()
        _every.add(self)

    def first(self, exc: BaseException) -> bool:
        """Count a failure; whether it is the first of its cause (of any cause, unless
        ``by_cause``) since things last worked."""
        cause = f"{type(exc).__module__}.{type(exc).__qualname__}" if self.by_cause else ""
        with self._lock:
            first = cause not in self._causes
            self._causes.add(cause)
            self._failures += 1
        return first

    def failed(self, exc: BaseException, message: str, *args: object) -> None:
        """Log ``message`` (what happened to the task) with ``exc``: at ERROR once per cause."""
        if self.first(exc):
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

    def recovered(self) -> int:
        """Things work again: how many failed since they last worked (0: nothing to say). Free
        while nothing fails: it is called on every success."""
        if not self._failures:
            return 0
        with self._lock:
            failures, self._failures = self._failures, 0
            self._causes.clear()
        return failures

    def ok(self) -> None:
        """Things work again: say so once, with how many failed meanwhile."""
        failures = self.recovered()
        if failures:
            what = self.what[:1].upper() + self.what[1:]
            self.logger.warning("%s works again after %d failure(s)", what, failures)
