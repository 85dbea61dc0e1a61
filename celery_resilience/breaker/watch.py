"""How a process hears of every breaker change: a thread subscribed to the scripts' channel.

The scripts publish ``<version>|<state>|<streak>|<epoch>|<name>`` whenever they change a
breaker's view (``lua/_common.lua``). While the subscription is live, a process may trust what it
last heard and admit calls on a closed breaker without a round trip; the moment the subscription
may have missed something (the connection dropped, a PING went unanswered) it says so, and the
process asks Redis again until it is live once more.

Whatever ends a subscription (an error, or any ``BaseException`` raised in the thread), the thread
subscribes again, waiting longer after each attempt that never went live. A loss that is not
Redis being out of reach (which the breakers already log, once) is logged at ERROR once per
outage and its end at WARNING (``TroubleLog``), not once per attempt.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, cast

import redis

from ..redact import get_logger
from ..trouble import TroubleLog
from .store import ChangeListener
from .types import STATES, Family, State

logger = get_logger("celery_resilience.watch")

#: Seconds of silence after which the subscription's connection is checked with a PING (a
#: dropped connection is noticed at once; a silent one, within two of these).
HEARTBEAT = 2.0
#: Seconds to wait before subscribing again after the feed was lost; doubled after each attempt
#: that never went live, up to ``MAX_RETRY_DELAY``.
RETRY_DELAY = 0.5
MAX_RETRY_DELAY = 10.0


class _Gone(Exception):
    """The owner of the callbacks was collected."""


def _weak(callback: Callable[..., None]) -> Callable[[], Callable[..., None] | None]:
    if inspect.ismethod(callback):
        return weakref.WeakMethod(callback)
    return lambda: callback


def parse_change(data: bytes | str) -> tuple[str, int, State, bool, str, Family | None] | None:
    """``(name, version, state, streak, epoch, family)`` of a published change, or ``None`` if
    malformed (a change from a version of the scripts without epochs included). ``family`` is
    the (version, epoch) of a derived breaker's family after the change, ``None`` for a declared
    breaker."""
    text = data.decode() if isinstance(data, bytes) else data
    family: Family | None = None
    try:
        if text.startswith("F|"):
            _, family_version, family_epoch, text = text.split("|", 3)
            family = (int(family_version), family_epoch)
        parts = text.split("|", 4)
        if len(parts) != 5 or parts[1] not in STATES:
            return None
        version, state, streak, epoch, name = parts
        return name, int(version), cast(State, state), streak == "1", epoch, family
    except ValueError:
        return None


class RedisWatch:
    """A daemon thread holding a subscription to ``channel``; ``close()`` ends it."""

    def __init__(
        self,
        client: redis.Redis,
        channel: str,
        on_change: ChangeListener,
        on_live: Callable[[], None],
        on_lost: Callable[[], None],
    ) -> None:
        self.client = client
        self.channel = channel
        # Held weakly: when their owner (a process's knowledge) is gone, the thread ends.
        self._callbacks = [_weak(c) for c in (on_change, on_live, on_lost)]
        self._stop = threading.Event()
        self._live = False
        self.trouble = TroubleLog(logger, "breaker change feed")
        self._thread = threading.Thread(
            target=self._run, name="celery-resilience-watch", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._stop.set()

    def _callback(self, index: int) -> Callable[..., None]:
        callback = self._callbacks[index]()
        if callback is None:
            self._stop.set()
            raise _Gone
        return callback

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        attempts = 0  # in a row that never went live
        while not self._stop.is_set():
            self._live = False
            try:
                self._session()
            except _Gone:
                return
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if self._stop.is_set():
                    return  # closed: its connection was closed under it
                # Redis itself is out of reach: the breakers log that, once (``RedisHealth``).
                if self._live:
                    logger.debug(
                        "Breaker change feed lost (%s): asking Redis until it is back", exc
                    )
            except BaseException as exc:  # anything else is the feed's own trouble: say so
                if self._stop.is_set():
                    return
                self.trouble.failed(exc, "Breaker change feed lost; every call asks Redis")
            # An attempt that went live starts the backoff again; one that never did doubles it.
            attempts = 0 if self._live else attempts + 1
            self._stop.wait(min(RETRY_DELAY * 2 ** max(0, attempts - 1), MAX_RETRY_DELAY))

    def _session(self) -> None:
        """One subscription, from connecting to its loss; says ``lost`` however it ends."""
        pubsub = cast(Any, self.client).pubsub()  # redis-py annotates it in some releases only
        try:
            self._listen(pubsub)
        finally:
            with contextlib.suppress(_Gone):
                self._callback(2)()  # lost
            try:
                pubsub.close()
            except Exception:  # the connection is gone anyway
                logger.debug("Closing the change feed's connection failed", exc_info=True)

    def _listen(self, pubsub: Any) -> None:
        pubsub.subscribe(self.channel)
        heard = time.monotonic()
        pinged = 0.0
        while not self._stop.is_set():
            message = pubsub.get_message(timeout=HEARTBEAT)
            now = time.monotonic()
            if message is None:
                if pinged and now - pinged > 2 * HEARTBEAT:
                    raise redis.ConnectionError("no answer to PING on the change feed")
                if not pinged and now - heard >= HEARTBEAT:
                    pubsub.ping()
                    pinged = now
                continue
            heard, pinged = now, 0.0
            kind = message.get("type")
            if kind == "subscribe":
                self._callback(1)()  # live: from now on, every change reaches this process
                self._live = True
                self.trouble.ok()
            elif kind == "message":
                change = parse_change(message["data"])
                if change is not None:
                    self._callback(0)(*change)
