"""The message of a replay: the entry sent again with its task id, options and replay headers,
routed to ``resilience_replay_queue`` when one is set."""

from __future__ import annotations

from functools import partial
from typing import Any

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
    run for a second per entry of an outage.
    """
    options = replay_options(runtime, dict(entry.options))
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


class Dropped(AsyncResult):  # type: ignore[misc]  # Celery is untyped
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
