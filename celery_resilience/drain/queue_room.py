"""Back-pressure for the drain: which queue a replay goes to, and how much room that queue has.

Replays share their queue with the app's other tasks: a task sent behind a long row of replays
waits for all of them. So the drain sends a replay only while its queue holds fewer than
``resilience_drain_max_queue_depth`` messages, and at most the difference per run.

The depth is the broker's own count: on Redis, kombu's ``LLEN`` of the queue's list and of the
extra list kept per priority step (``<queue>\\x06\\x16<step>``), counted by kombu's transport so
that it names the lists (and applies its ``global_keyprefix``); on RabbitMQ, the
``message_count`` of a passive ``queue_declare``. Messages a worker already prefetched are not
in the queue: the default leaves room for them (``config.DEFAULT_MAX_QUEUE_DEPTH``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from kombu.transport.virtual import Channel as VirtualChannel

from ..backout.entry import ParkedTask
from ..redact import get_logger
from ..runtime import Runtime
from .message import replay_options

logger = get_logger("celery_resilience.drain")

#: Seconds to wait for a broker connection from the app's pool before the queue counts as full.
POOL_TIMEOUT = 5.0


def target_queue(runtime: Runtime, entry: ParkedTask) -> str:
    """The name of the queue a replay of ``entry`` goes to, as ``send_task`` would route it."""
    app = runtime.app
    options = replay_options(runtime, dict(entry.options))
    queue = options.get("queue")
    if queue:
        return str(getattr(queue, "name", queue))
    routing_key = options.get("routing_key")
    # A delivery's own routing: the default exchange routes by queue name.
    if routing_key and options.get("exchange") in (None, "", app.conf.task_default_exchange):
        return str(routing_key)
    routed = app.amqp.router.route(options, entry.task_name, entry.args, entry.kwargs)
    return str(getattr(routed.get("queue"), "name", app.conf.task_default_queue))


def queue_depth(app: Any, queue: str) -> int:
    """Messages waiting in ``queue`` on the app's broker (0 for a queue that does not exist)."""
    with app.pool.acquire(block=True, timeout=POOL_TIMEOUT) as connection:
        channel = connection.default_channel
        if isinstance(channel, VirtualChannel):
            # The transport's own count (Redis: LLEN of the queue's list and of each priority
            # list). Not its passive declare: on Redis that asks EXISTS, which kombu's
            # ``global_keyprefix`` does not cover, so a prefixed queue would always look absent.
            return int(cast(Any, channel)._size(queue))
        # A failed passive declare closes an AMQP channel: use one of its own.
        channel = connection.channel()
        try:
            return int(channel.queue_declare(queue=queue, passive=True).message_count)
        except connection.channel_errors:  # NOT_FOUND: nothing was ever sent there
            return 0
        finally:
            channel.close()


class QueueRoom:
    """Room per queue for one drain run: measured once per queue, spent as replays go out."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.max_depth = runtime.config.drain_max_queue_depth
        self._room: dict[str, int] = {}
        #: Queues that had no room at all when measured: their workers are behind.
        self._full_at_start: set[str] = set()
        #: A queue's depth could not be read (the broker is down): nothing was let through.
        self.unreadable = False

    def fit(self, entries: Iterable[ParkedTask]) -> tuple[list[ParkedTask], list[ParkedTask]]:
        """Split ``entries`` into those their queue has room for now and those that must wait."""
        go: list[ParkedTask] = []
        wait: list[ParkedTask] = []
        for entry in entries:
            if self.max_depth is None:
                go.append(entry)
                continue
            queue = target_queue(self.runtime, entry)
            if queue not in self._room:
                self._room[queue] = self._measure(queue)
                if self._room[queue] <= 0:
                    self._full_at_start.add(queue)
            if self._room[queue] > 0:
                self._room[queue] -= 1
                go.append(entry)
            else:
                wait.append(entry)
        return go, wait

    def was_full(self) -> bool:
        """Whether every queue measured in this run had no room before the run sent anything:
        their workers have not caught up with the last pass, so the next one waits longer. (A
        queue this run filled is not: its workers may empty it before the next pass.)"""
        return bool(self._room) and self._full_at_start == set(self._room)

    def _measure(self, queue: str) -> int:
        assert self.max_depth is not None
        try:
            depth = queue_depth(self.runtime.app, queue)
        except Exception as exc:  # the broker is unreachable: publishing would fail too
            logger.warning("Could not read the depth of queue %r: %s", queue, exc)
            self.unreadable = True
            return 0
        return max(0, self.max_depth - depth)
