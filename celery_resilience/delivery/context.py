"""What each step of a delivery is handed: the task's options, Celery's task behind a small
typed port, the request and the app's runtime.

The task that Celery calls (``ResilientTask``) builds a :class:`Delivery` and hands it to the
pipeline (``pipeline.py``); no step reaches back into ``ResilientTask`` itself. Its options are
a frozen value, made once per task; what the steps ask of Celery (publish this delivery's
message again, its publish options, the task's state and events) goes through
:class:`TaskPort`, a part of Celery's own task API that ``ResilientTask`` has by being a
``celery.Task``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..backoff import BackoffStrategy
from ..backout.masking import Masking
from ..breaker.permit import Permit
from ..known_tasks import masking_of
from ..redact import redact
from ..runtime import Runtime

#: A derived breaker's key: a template of the arguments (``"{host}"``) or a callable given them.
KeyOption = str | Callable[..., Any] | None


class TaskPort(Protocol):
    """The calls a delivery makes on Celery's task object: Celery's own API, nothing of the
    package's. ``ResilientTask`` implements it as any ``celery.Task`` does. The same object
    sends the ``task-parked`` event (``events.send_task_parked``) and is the sender of the
    ``task_parked`` signal."""

    name: str
    ignore_result: bool
    backend: Any

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """The body (a derived breaker's key template is bound to its signature)."""

    def signature_from_request(self, request: Any = None, **options: Any) -> Any:
        """A signature of ``request`` (a retry, a kept copy, a parked entry's options)."""

    def update_state(
        self, task_id: str | None = None, state: str | None = None, meta: Any = None
    ) -> None:
        """The task's state in the result backend (``PARKED``)."""


@dataclass(frozen=True)
class Options:
    """The task's options a delivery reads (``ResilientTask``'s class attributes), made once
    per task."""

    max_retries: int | None
    backoff: BackoffStrategy
    on_open: str = "park"
    breaker: str | None = None
    breaker_key: KeyOption = None
    retry_on: tuple[type[BaseException], ...] = ()
    park_on: tuple[type[BaseException], ...] = ()
    deduplicate: bool = False
    #: ``deduplicate``'s key: a template of the arguments or a callable (``dedup_key.py``);
    #: ``None``: the task id is claimed.
    dedup_key: KeyOption = None
    acks_late: bool = False


@dataclass(eq=False, slots=True)
class Delivery:
    """One delivery of a task (a message a worker hands to it, or a call of ``apply()``), as
    the pipeline's steps see it; ``permit`` and ``claim`` are what its admission took."""

    task: TaskPort
    options: Options
    request: Any  # Celery's request context
    runtime: Runtime
    permit: Permit | None = None
    claim: str = ""

    @property
    def masking(self) -> Masking:
        """How the app shows this task's arguments and errors (``resilience_error_text``, its
        sensitive keys)."""
        return masking_of(self.runtime)

    def reprs(self) -> dict[str, str]:
        """The ``argsrepr`` / ``kwargsrepr`` a message of this delivery published again carries
        (what Flower and the worker's log show of its arguments): the caller's, with each
        sensitive value and credential masked. Celery's own, from the arguments, otherwise."""
        request, found = self.request, {}
        for name in ("argsrepr", "kwargsrepr"):
            given = getattr(request, name, None)
            if isinstance(given, str):
                found[name] = redact(
                    self.masking.text(given, self.task.name, request.args, request.kwargs)
                )
        return found

    def shown(self, exc: BaseException | None) -> BaseException | None:
        """``exc`` as logs and the result backend may show it (``exc`` itself when nothing of
        it is masked)."""
        request = self.request
        return self.masking.exception(exc, self.task.name, request.args, request.kwargs)
