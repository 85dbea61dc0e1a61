"""``ResilientTask`` options: checked when the task class is made, as ``@app.task`` keywords or
class attributes of a subclass; a bad one raises ``ConfigurationError`` naming task and option.

When "made" is: Celery's ``@app.task`` builds the task class at once on a finalized app (a
worker's, or after first use), but on an app not finalized yet (the usual module-level
decorator) it returns a proxy and builds the class when the app finalizes or the task is first
used; the error comes then. Tasks here are ``shared=False``: a shared task with a bad option
would be built again, and raise, in every app finalized later in the process.
"""

from __future__ import annotations

import re
import socket
from typing import Any

import pytest
from celery import Celery

from celery_resilience import ConfigurationError, ResilientTask, backoff

pytestmark = pytest.mark.unit

TASK = f"{__name__}.charge"


@pytest.fixture
def app(redis_url: str) -> Celery:
    """A finalized app (as in a worker): ``@app.task`` makes the task class at once."""
    app = Celery("t", broker=redis_url, set_as_current=False)
    app.finalize()
    return app


def charge(self: Any, order_id: int) -> int:
    return order_id


def make_task(app: Celery, **options: Any) -> Any:
    return app.task(base=ResilientTask, bind=True, shared=False, **options)(charge)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("on_open", "x"),
        ("retry_on", 5),
        ("retry_on", (ConnectionError, 5)),
        ("park_on", [ValueError, 5]),
        ("backoff", "fast"),
        ("backoff", 1.5),
        ("max_retries", -1),
        ("max_retries", True),
        ("max_retries", "3"),
        ("breaker", 3),
    ],
)
def test_bad_option_raises_naming_the_task_and_the_option(
    app: Celery, option: str, value: Any
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(f"{TASK}.{option} ")):
        make_task(app, **{option: value})
    assert TASK not in app.tasks


def test_bad_option_on_an_app_not_yet_finalized_raises_when_the_app_finalizes(
    redis_url: str,
) -> None:
    app = Celery("t", broker=redis_url, set_as_current=False)

    make_task(app, on_open="x")  # a lazy proxy: nothing built yet

    with pytest.raises(ConfigurationError, match=re.escape(f"{TASK}.on_open")):
        app.finalize()


def test_bad_option_on_a_subclass_raises_naming_the_class() -> None:
    with pytest.raises(ConfigurationError, match=re.escape("Sloppy.retry_on")):

        class Sloppy(ResilientTask):
            retry_on = "no_such_module_xyz.Error"  # type: ignore[assignment]  # on purpose


def test_options_as_class_attributes_of_a_subclass(app: Celery) -> None:
    class Charge(ResilientTask):
        breaker = "payments"
        retry_on = (IOError,)
        max_retries = 7
        on_open = "retry"

    task = app.task(base=Charge, bind=True, shared=False)(charge)

    assert isinstance(task, Charge)
    assert (task.breaker, task.retry_on, task.max_retries, task.on_open) == (
        "payments",
        (OSError,),
        7,
        "retry",
    )


def test_task_keywords_override_the_subclass_attributes(app: Celery) -> None:
    class Charge(ResilientTask):
        breaker = "payments"
        retry_on = (IOError,)

    task = app.task(base=Charge, bind=True, shared=False, breaker="fraud", park_on=KeyError)(charge)

    assert (task.breaker, task.retry_on, task.park_on) == ("fraud", (OSError,), (KeyError,))


def test_a_single_exception_class_is_normalized_to_a_tuple(app: Celery) -> None:
    task = make_task(app, retry_on=TimeoutError, park_on=[LookupError, PermissionError])

    assert task.retry_on == (TimeoutError,)
    assert task.park_on == (LookupError, PermissionError)


def test_defaults_when_no_option_is_given(app: Celery) -> None:
    task = make_task(app)

    assert task.breaker is None
    assert (task.retry_on, task.park_on) == ((), ())
    assert (task.max_retries, task.on_open, task.deduplicate) == (3, "park", False)
    assert isinstance(task.backoff, backoff.Exponential)


class FixedPause:
    """A strategy of one's own: anything with ``__call__(attempt)`` and ``max_delay()``."""

    def __call__(self, attempt: int) -> float:
        return 2.0

    def max_delay(self) -> float:
        return 2.0


@pytest.mark.parametrize(
    "options",
    [
        {"max_retries": None},
        {"max_retries": 0},
        {"backoff": backoff.Constant(1.0)},
        {"backoff": backoff.DecorrelatedJitter(base=1.0, cap=60.0)},
        {"backoff": FixedPause()},
        {"on_open": "retry", "deduplicate": True, "breaker": "payments"},
    ],
    ids=["unlimited", "no-retry", "constant", "decorrelated", "own-strategy", "others"],
)
def test_good_options_are_accepted(app: Celery, options: dict[str, Any]) -> None:
    task = make_task(app, **options)

    for option, value in options.items():
        assert getattr(task, option) is value


def test_exception_options_take_dotted_paths_as_the_breaker_ignore_setting_does(
    app: Celery,
) -> None:
    task = make_task(
        app, retry_on=("builtins.ConnectionError", "socket:timeout"), park_on="KeyError"
    )

    assert task.retry_on == (ConnectionError, socket.timeout)
    assert task.park_on == (KeyError,)


def test_the_request_class_is_found_by_its_path_and_by_its_deprecated_one() -> None:
    from celery.utils.imports import symbol_by_name

    from celery_resilience.task import ResilientRequest

    # What a worker loads for a ResilientTask's messages
    assert symbol_by_name(ResilientTask.Request) is ResilientRequest
    # and a subclass made for the name of an earlier release still gets the same class
    with pytest.warns(DeprecationWarning, match="celery_resilience.task.ResilientRequest"):
        assert symbol_by_name("celery_resilience.time_limits:ResilientRequest") is ResilientRequest
