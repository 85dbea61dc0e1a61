"""The message of a replay: the entry sent again with its task id, options and replay headers,
routed to ``resilience_replay_queue`` when one is set."""

from __future__ import annotations

from functools import partial
from typing import Any
from weakref import WeakKeyDictionary

from celery.result import AsyncResult

from ..backout.entry import ParkedTask
from ..headers import replay_headers
from ..runtime import Runtime


def publish(runtime: Runtime, entry: ParkedTask, producer: Any = None) -> None:
    """Send ``entry`` again with its task id and options (checked by :func:`preflight` first).

    Through ``send_task``, which takes the registered task's own options and routes as
    ``apply_async`` does, without checking the arguments a second time. Not added to the
    drain task's children: a drain of thousands would hold them all in its request. Sent once
    (``retry=False``): the drain decides what a failed publish means (the broker down: the batch
    is given back; the entry refused: it dies), where kombu's own retries would only hold the
    run for a second per entry of an outage. With a ``producer``, a queue named in the options
    is given as its copy bound to the producer's channel (:class:`BoundQueues`).
    """
    tracing = runtime.tracing
    if tracing is None:
        _publish(runtime, entry, producer)
    else:
        tracing.replay(entry, lambda: _publish(runtime, entry, producer))


def _publish(runtime: Runtime, entry: ParkedTask, producer: Any) -> None:
    options = replay_options(runtime, dict(entry.options))
    if producer is not None:
        queues = BoundQueues.of(runtime.app, producer)
        if queues is not None:
            queues.bind(options)
    headers = replay_headers(options, entry.replays)
    options.pop("headers", None)
    app = runtime.app
    # send_task ignores eager mode: run it at once, as a test expects (if this process can).
    if app.conf.task_always_eager and entry.task_name in app.tasks:
        task = app.tasks[entry.task_name]
        task.apply_async(
            entry.args, entry.kwargs, task_id=entry.task_id, headers=headers, **options
        )
        return
    app.send_task(
        entry.task_name,
        entry.args,
        entry.kwargs,
        task_id=entry.task_id,
        headers=headers,
        producer=producer,
        add_to_parent=False,
        retry=False,
        result_cls=partial(Dropped, app=app),  # bound to the app, as send_task's own
        **options,
    )


class BoundQueues:
    """The queues of one producer's channel, each bound to it once.

    Celery's ``send_task`` looks a queue named in the options up in ``app.amqp.queues`` and
    kombu binds a fresh copy of it to the channel for every message (``maybe_declare`` with
    ``retry=False`` keeps no bound copy): most of a replay's cost past the broker's own. A bound
    copy of the same queue, given as the option, is routed, declared (once per connection, as
    before) and published alike.
    """

    def __init__(self, app: Any, channel: Any) -> None:
        self.queues = app.amqp.queues
        self.channel = channel
        self._bound: dict[str, Any] = {}

    @classmethod
    def of(cls, app: Any, producer: Any) -> BoundQueues | None:
        """The bound queues of ``producer``'s channel (new when the channel changed: a
        reconnect); ``None`` when it has no channel to bind to."""
        try:
            channel = producer.channel
            known = _BOUND.get(producer)
        except Exception:  # no channel now (the broker is away): send_task will say so
            return None
        if known is None or known.channel is not channel or known.queues is not app.amqp.queues:
            known = _BOUND[producer] = cls(app, channel)
        return known

    def bind(self, options: dict[str, Any]) -> None:
        """Replace a queue named in ``options`` by its bound copy (a name the app does not know
        is left to ``send_task``, which raises or creates it as it always does)."""
        name = options.get("queue")
        if not isinstance(name, str) or not name:
            return
        bound = self._bound.get(name)
        if bound is None:
            try:
                bound = self.queues[name].bind(self.channel)
            except Exception:
                return
            self._bound[name] = bound
        options["queue"] = bound


#: Each producer's bound queues (a pooled producer serves many batches).
_BOUND: WeakKeyDictionary[Any, BoundQueues] = WeakKeyDictionary()


class Dropped(AsyncResult):
    """The result handle of a replay, which the drain drops at once.

    A dropped ``AsyncResult`` ends the subscription to its id's result. Before Celery 5.7 it ends
    it for every result of this process that waits on the same id (celery/celery#4925): a
    group's ``get()`` in a process that also replays its members would wait forever. This one
    leaves the subscription to such a waiter.
    """

    def __del__(self) -> None:
        # Celery 5.4-5.6 map an id to its waiter, 5.7 to the waiters (an empty mapping once they
        # are gone): either way a true value means someone else waits.
        pending = getattr(self.backend, "_pending_results", ())
        if any(mapping.get(self.id) for mapping in pending):
            return
        super().__del__()


def replay_options(runtime: Runtime, options: dict[str, Any]) -> dict[str, Any]:
    """The publish options of a replay: its own, or routed to ``resilience_replay_queue``.

    The original exchange and routing key go with the override: they would win over the queue.
    """
    queue = runtime.config.replay_queue
    if queue is None:
        return options
    routed = {k: v for k, v in options.items() if k not in ("exchange", "routing_key")}
    routed["queue"] = queue
    return routed
