"""Every message published to a Redis broker of the test's own, seen from the broker's side.

A ledger keyed by task id can't tell one message from two: a retry, a kept copy and a replay
each publish the same task id again. :class:`BrokerTap` follows the broker's ``MONITOR`` (a
private server: nobody else's commands) and records each push to the world's queues with the
task id and kombu's ``delivery_tag``, which each publish draws anew and a restore of an unacked
message keeps. Distinct tags per task id are the messages published for it, whichever process
published them (the test, a worker, a drainer) and whatever path (one by one, in a batch
pipeline, inside MULTI). A message is done once a worker acks it (``HDEL`` of its tag from
kombu's ``unacked``; a restore deletes and pushes it again in one MULTI, so it stays live).
Unlike a look at the keys, which reads the queue and ``unacked`` one after the other, this
never misses a message that a worker has just taken from the queue and not yet recorded as
unacked, or one that moved between the two reads.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections import defaultdict
from collections.abc import Iterable
from typing import Any, cast

import redis

from .waiting import wait_for

PUSHES = ("LPUSH", "RPUSH")
TASK_ID = re.compile(r'"id": "(?P<id>[^"]+)"')
TAG = re.compile(r'"delivery_tag": "(?P<tag>[^"]+)"')


class BrokerTap:
    """``MONITOR`` of one broker in a thread: the messages pushed to keys starting with
    ``queue_key`` (the queue, and its priority lists)."""

    def __init__(self, broker: redis.Redis, queue_key: str, unacked_key: str) -> None:
        self.broker = broker
        self.queue_key = queue_key
        self.unacked_key = unacked_key
        self._tags: dict[str, set[str]] = defaultdict(set)
        #: Tags pushed and not acked since, with their task ids.
        self._live: dict[str, str] = {}
        self._markers: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="broker-tap", daemon=True)
        self._thread.start()
        wait_for(self._started.is_set, "the broker's MONITOR to start", 10)
        self.sync()

    def _run(self) -> None:
        # A connection of its own with no read timeout: a broker may stay quiet for longer than
        # the tests' client waits for a reply (a hard time limit, a keep delay), which is no error.
        pool = self.broker.connection_pool
        options = {**pool.connection_kwargs, "socket_timeout": None}
        client = redis.Redis(
            connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **options)
        )
        try:
            with cast(Any, client).monitor() as monitor:  # annotated in some releases only
                self._started.set()
                while not self._stop.is_set():
                    try:
                        command = monitor.next_command()["command"]
                    except (redis.ConnectionError, redis.TimeoutError):
                        if self._stop.is_set():
                            return
                        raise
                    self._record(command)
        finally:
            client.close()

    def _record(self, command: str) -> None:
        # redis-py gives the arguments unquoted, joined by spaces: "LPUSH <key> <message>...".
        name, _, rest = command.partition(" ")
        if name == "ECHO" and rest.startswith("broker-tap-"):
            with self._lock:
                self._markers.add(rest)
            return
        key, _, messages = rest.partition(" ")
        if name.upper() == "HDEL" and key == self.unacked_key:
            with self._lock:
                for tag in messages.split(" "):
                    self._live.pop(tag, None)
            return
        if name.upper() not in PUSHES or not key.startswith(self.queue_key):
            return
        # One push may carry several messages: each names its id (headers) and tag (properties).
        ids, tags = TASK_ID.findall(messages), TAG.findall(messages)
        with self._lock:
            for task_id, tag in zip(ids, tags, strict=True):
                self._tags[task_id].add(tag)
                self._live[tag] = task_id

    def sync(self) -> None:
        """Return once the tap has read every command the broker ran before this call."""
        marker = f"broker-tap-{uuid.uuid4().hex}"
        self.broker.echo(marker)
        wait_for(lambda: marker in self._markers, "the tap to catch up with the broker", 10)

    def messages(self, ids: Iterable[str]) -> dict[str, int]:
        """Task id -> messages published for it so far (restores of one message count once)."""
        self.sync()
        with self._lock:
            return {t: len(self._tags.get(t, ())) for t in ids}

    def pending(self, ids: Iterable[str]) -> int:
        """Messages of ``ids`` published (or restored) and not acked yet."""
        self.sync()
        wanted = set(ids)
        with self._lock:
            return sum(1 for task_id in self._live.values() if task_id in wanted)

    def close(self) -> None:
        self._stop.set()
        self.broker.echo(f"broker-tap-{uuid.uuid4().hex}")  # wakes the thread to see the stop
        self._thread.join(5)
