"""The worker app of the workflow (canvas) and direct-call tests: ``tests.apps.workerapp``'s app and
world (``WORKERAPP_*`` variables), with the tasks those tests compose.

``CANVASAPP_DJANGO_DB`` (JSON: the Django ``DATABASES`` entry of a migrated test database) makes
django-celery-results' database backend (``django-db``, the example project's) the result
backend instead of Redis; the test process configures Django on the same database first.

Every task writes what it saw to lists under the world's prefix (``<P>:ran``, ``<P>:errbacks``),
so a test reads what ran, how often and with which request, whatever the result backend.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

from celery import Celery

from celery_resilience import Resilience, ResilientTask
from tests.apps.workerapp import call_dependency, client, make_app, settings

#: Settings of the direct-call tasks: (acks_late, deduplicate, breaker), every combination.
FIB_VARIANTS = [
    (acks_late, deduplicate, breaker)
    for acks_late in (True, False)
    for deduplicate in (True, False)
    for breaker in ("dep", None)
]
#: How often a message may be delivered (``resilience_max_deliveries``): a message the broker
#: flags redelivered is its second delivery; a nested direct call counted as a third would park it.
MAX_DELIVERIES = 2

#: The same body on ``celery.Task``: what every variant must do.
PLAIN_FIB = "canvas.fib-plain"


class NotNow(Exception):
    """The dependency said "come back later": the task parks at once (``park_on``)."""


def fib_name(acks_late: bool, deduplicate: bool, breaker: str | None) -> str:
    return f"canvas.fib-{int(acks_late)}{int(deduplicate)}-{breaker or 'none'}"


def configure_django(database: Mapping[str, Any]) -> None:
    """Django with django-celery-results on ``database`` (once per process)."""
    import django
    from django.conf import settings as django_settings

    if django_settings.configured:  # the test process: tests.support.django_settings did it
        return
    django_settings.configure(
        INSTALLED_APPS=["django_celery_results"],
        DATABASES={"default": dict(database)},
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()


def make_canvas_app(env: Mapping[str, str]) -> Celery:
    """``tests.apps.workerapp``'s app of this world, with the canvas tasks (and Django, if
    asked)."""
    s = settings(env)
    app = make_app(env)
    app.conf.resilience_max_deliveries = MAX_DELIVERIES
    app.conf.resilience_park_on_delay = 0.2  # a park_on entry is due again within 0.4 s
    database = env.get("CANVASAPP_DJANGO_DB")
    if database:
        configure_django(json.loads(database))
        app.conf.result_backend = "django-db"
    define_canvas_tasks(app, s)
    return app


def define_canvas_tasks(app: Celery, s: Mapping[str, Any]) -> None:
    prefix, url = s["prefix"], s["ledger"]
    ran, errbacks = f"{prefix}:ran", f"{prefix}:errbacks"
    # ResilientTask as every task's base, its options off where a task needs none: the drop-in.
    base = {"base": ResilientTask, "bind": True, "shared": False}
    late = {**base, "acks_late": True, "reject_on_worker_lost": True}

    def record(task: Any, **seen: Any) -> None:
        request = task.request
        seen.update(
            task=task.name,
            id=request.id,
            parent_id=request.parent_id,
            root_id=request.root_id,
            group=request.group,
        )
        client(url).rpush(ran, json.dumps(seen))

    @app.task(name="canvas.add", breaker="dep", retry_on=(ConnectionError,), **late)
    def add(self: Any, x: int, y: int) -> int:
        """A call to the dependency: parks while the breaker is open."""
        call_dependency(client(url), prefix, self, f"{x}+{y}")
        record(self, args=[x, y])
        return x + y

    @app.task(name="canvas.later", park_on=(NotNow,), **late)
    def later(self: Any, x: int) -> int:
        """The dependency answers "not now", every time: parked again at each replay."""
        raise NotNow(f"not now ({x})")

    @app.task(name="canvas.double", **late)
    def double(self: Any, x: int) -> int:
        """No breaker: runs at once, whatever the dependency does."""
        record(self, args=[x])
        return 2 * x

    @app.task(name="canvas.collect", **base)
    def collect(self: Any, value: Any, tag: str) -> Any:
        """A chain's next link, a chord's callback, a ``link``: records what it was given."""
        record(self, args=[value, tag])
        return value

    @app.task(name="canvas.known", **base)
    def known(self: Any, breaker: str) -> str:
        """The breaker's state as this worker knows it: what its next admission goes by."""
        return str(Resilience.for_app(self.app).breaker(breaker).known_state())

    # Not bound: Celery calls a bound errback with the task id alone, as it did before 4.0.
    @app.task(name="canvas.errback", base=ResilientTask, shared=False)
    def errback(request: Any, exc: BaseException, traceback: Any) -> None:
        """A ``link_error`` callback: Celery calls it with the failed task's request."""
        failure = {"task_id": request.id, "exc_type": type(exc).__name__, "exc": str(exc)}
        client(url).rpush(errbacks, json.dumps(failure))

    for acks_late, deduplicate, breaker in FIB_VARIANTS:
        options: dict[str, Any] = {
            "acks_late": acks_late,
            "deduplicate": deduplicate,
            "breaker": breaker,
        }
        options["retry_on"] = (ConnectionError,)
        define_fib(app, ran, url, fib_name(acks_late, deduplicate, breaker), **base, **options)
    define_fib(app, ran, url, PLAIN_FIB, bind=True, shared=False)  # celery.Task: the reference


#: The task id of the delivery whose body runs now: its nested calls are recorded under it (their
#: request's id is the parent's from Celery 5.5 on, ``None`` before).
_delivery: ContextVar[str | None] = ContextVar("delivery", default=None)


def define_fib(app: Celery, ran: str, url: str, name: str, **options: Any) -> None:
    @app.task(name=name, **options)
    def fib(self: Any, n: int) -> int:
        """Calls itself directly: each call must see a request of its own, as in Celery."""
        request = self.request
        outer = _delivery.get() is None
        token = _delivery.set(request.id) if outer else None
        try:
            seen = {"task": name, "id": request.id, "n": n, "args": list(request.args or ())}
            seen["called_directly"] = request.called_directly
            seen["delivery"] = _delivery.get()
            client(url).rpush(ran, json.dumps(seen))
            return n if n < 2 else fib(n - 1) + fib(n - 2)
        finally:
            if token is not None:
                _delivery.reset(token)


app = make_canvas_app(os.environ)
