"""A dead entry's task failed in Celery, so that nothing waits for it: its result, its
``link_error`` callbacks, the chord or chain it belongs to."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from celery import Celery, _state
from celery.app.task import Context

from ..backout.entry import ParkedTask
from ..delivery import parking
from ..errors import ParkedTaskDead
from ..known_tasks import masking_of
from ..redact import get_logger
from ..runtime import Runtime

logger = get_logger("celery_resilience.drain")


def fail_task(runtime: Runtime, entry: ParkedTask, dead_reason: str) -> None:
    """Fail the task of an entry that just died, as a worker fails a task: its result becomes
    ``FAILURE`` (:class:`ParkedTaskDead`), its ``link_error`` callbacks are called, a chord it
    belongs to counts it (and so fails instead of waiting for it forever), a chain it heads is
    marked failed. Celery's own ``backend.mark_as_failure``, with the request its message had.

    Called once the entry is marked dead; trouble here is logged, never raised: the entry stays
    dead in the store either way, for a person to see.
    """
    if entry.status != "parked" or not entry.task_id:  # already dead, or never readable
        return
    app, options = runtime.app, entry.options
    task = app.tasks.get(entry.task_name)
    masking = masking_of(runtime)  # the result backend is outside the store
    detail = f": last error {parking.error(entry, masking)}" if entry.exc_type else ""
    trace = masking.error(entry.traceback, entry.task_name, entry.args, entry.kwargs)
    exc = ParkedTaskDead(
        f"{entry.task_name}[{entry.task_id}] is dead in the back-out store ({dead_reason}){detail}"
    )
    request = Context(
        id=entry.task_id,
        task=entry.task_name,
        args=entry.args,
        kwargs=entry.kwargs,
        root_id=options.get("root_id"),
        parent_id=options.get("parent_id"),
        group=options.get("group_id"),
        group_index=options.get("group_index"),
        chord=options.get("chord"),
        chain=options.get("chain"),
        callbacks=options.get("link"),
        errbacks=options.get("link_error"),
        delivery_info={},
    )
    ignore_result = options.get("ignore_result", task is not None and task.ignore_result)
    try:
        backend = app.backend if task is None else task.backend
        with current(app):
            backend.mark_as_failure(
                entry.task_id,
                exc,
                traceback=trace or None,
                request=request,
                store_result=not ignore_result or bool(task and task.store_errors_even_if_ignored),
                call_errbacks=True,
            )
    except Exception:
        logger.exception("Could not fail %s[%s] in Celery", entry.task_name, entry.task_id)


@contextmanager
def current(app: Celery) -> Iterator[None]:
    """``app`` as this thread's current app for the block, as it is in its own worker.

    Celery before 5.6 counts a chord's failed member with the *current* app's backend (the Redis
    backend's ``GroupResult.restore(gid)``, given no app); the drain may run in a process whose
    current app is another one, or the default app without a result backend (a CLI, a web
    process, a test), where the chord would fail with an ``AttributeError`` instead of the
    member's error.
    """
    # The thread's own setting, not get_current_app(): that would make Celery's fallback app
    # where none was set, and then leave it set.
    previous = getattr(_state._tls, "current_app", None)
    _state._set_current_app(app)
    try:
        yield
    finally:
        _state._set_current_app(previous)
