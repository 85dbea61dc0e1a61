"""The package's public signal: ``task_parked``.

The package's own handlers of Celery's worker signals live in ``worker.py``.
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

#: Sent after a task was parked: ``sender`` is the task, with ``entry`` (the ParkedTask) and
#: ``request``. Handlers run in the worker, after the entry is stored, before the message is
#: acked; an exception in a handler is logged and changes nothing.
task_parked = Signal(name="task_parked", providing_args={"entry", "request"})
