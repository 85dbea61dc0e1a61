"""What no person reads of a task: its sensitive arguments, by keyword or by position, and the
error texts that quote them (``backout/masking.py``, ``known_tasks.py``); and what of an error
leaves the store (``resilience_error_text``)."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest
from celery import Celery, Task
from celery.backends.base import Backend as BaseBackend
from cryptography.fernet import Fernet

from celery_resilience import ConfigurationError, Resilience, known_tasks
from celery_resilience.backout.entry import ParkedTask
from celery_resilience.backout.masking import MASK, Masking
from celery_resilience.backout.summary import arguments
from celery_resilience.config import ResilienceConfig
from celery_resilience.known_tasks import is_registered, masking_of, positions_of

pytestmark = pytest.mark.unit

CARD = "4111111111111111"


@pytest.fixture
def app() -> Celery:
    """An app whose tasks take a card number by position, each kind of way."""
    app = Celery("masking", broker="memory://", set_as_current=False)
    app.conf.resilience_redis_url = "memory://"
    app.conf.resilience_sensitive_keys = ["card_number", "cards"]

    @app.task(name="shop.plain", shared=False)
    def plain(order_id: int, card_number: str, amount: int = 1) -> None: ...

    @app.task(name="shop.bound", bind=True, shared=False)
    def bound(self: Any, order_id: int, card_number: str) -> None: ...

    @app.task(name="shop.many", shared=False)
    def many(order_id: int, *cards: str) -> None: ...

    @app.task(name="shop.loose", shared=False)
    def loose(*args: Any, **kwargs: Any) -> None: ...

    class Charge(Task):
        name = "shop.class_based"

        def run(self, order_id: int, card_number: str) -> None: ...

    app.register_task(Charge())
    return app


def masking(app: Celery) -> Masking:
    return masking_of(Resilience(app).runtime)


@pytest.mark.parametrize("task", ["shop.plain", "shop.bound", "shop.class_based"])
def test_a_positional_argument_is_masked_by_its_parameters_name(app: Celery, task: str) -> None:
    # A bound task's and a class-based task's ``self`` is no position.
    assert masking(app).args(task, [15, CARD]) == [15, MASK]


def test_every_extra_position_of_a_sensitive_star_args_is_masked(app: Celery) -> None:
    assert masking(app).args("shop.many", [15, CARD, CARD]) == [15, MASK, MASK]


def test_a_star_args_task_names_no_position(app: Celery) -> None:
    shown = masking(app).args("shop.loose", [15, {"card_number": CARD}])
    assert shown == [15, {"card_number": MASK}]  # a key at any depth is still a name


def test_a_task_this_process_does_not_know_has_every_position_masked(app: Celery) -> None:
    assert masking(app).args("shop.gone", [15, CARD]) == [MASK, MASK]
    assert positions_of(app.tasks["shop.plain"]) is not None


def test_without_sensitive_keys_nothing_is_masked(app: Celery) -> None:
    app.conf.resilience_sensitive_keys = []
    assert masking(app).args("shop.gone", [15, CARD]) == [15, CARD]


def test_the_whole_call_as_a_person_sees_it(app: Celery) -> None:
    entry = ParkedTask.new(
        task_name="shop.plain", task_id="t", reason="breaker_open", args=[15, CARD], kwargs={}
    )
    assert arguments(entry, masking(app)) == f"15, '{MASK}'"


def test_an_error_text_shows_no_sensitive_value_it_quotes(app: Celery) -> None:
    text = (
        f"card {CARD} declined (order 15, cvv 123, ref 41234; 'card_number': '{CARD}', "
        "card_number=5500000000000004)"
    )
    shown = masking(app).text(text, "shop.plain", [15, CARD], {"cvv": "123"})
    assert CARD not in shown
    assert "card_number=***" in shown  # beside its name, even a value not among the arguments
    assert "order 15" in shown  # not sensitive
    assert "cvv 123" in shown  # "cvv" is no sensitive key here

    app.conf.resilience_sensitive_keys = ["card_number", "cvv"]
    shown = masking(app).text(text, "shop.plain", [15, CARD], {"cvv": "123"})
    assert "cvv ***," in shown
    assert "ref 41234" in shown  # a value is masked where it stands whole only


@pytest.mark.parametrize(
    ("setting", "encrypted", "shown"),
    [
        (None, False, f"card {MASK} declined"),  # the default without an encryption key
        (None, True, ""),  # with one: the store seals the text, only the type leaves it
        ("masked", True, f"card {MASK} declined"),
        ("full", False, f"card {CARD} declined"),
        ("type", False, ""),
    ],
)
def test_error_text_says_what_of_an_error_leaves_the_store(
    app: Celery, setting: str | None, encrypted: bool, shown: str
) -> None:
    app.conf.resilience_error_text = setting
    app.conf.resilience_encryption_key = Fernet.generate_key().decode() if encrypted else None
    message = f"card {CARD} declined"
    assert masking(app).error(message, "shop.plain", [15, CARD], {}) == shown
    cause = masking(app).exception(ValueError(message), "shop.plain", [15, CARD], {})
    assert isinstance(cause, ValueError)
    assert str(cause) == shown


def test_an_error_shown_whole_is_the_error_itself(app: Celery) -> None:
    cause = ValueError("gateway down")
    assert masking(app).exception(cause, "shop.plain", [15, CARD], {}) is cause


def test_a_json_encoded_argument_is_masked_inside(app: Celery) -> None:
    payload = json.dumps({"order": 15, "card_number": CARD})
    [shown] = masking(app).args("shop.loose", [payload])
    assert json.loads(shown) == {"order": 15, "card_number": MASK}
    error = f"gateway refused {payload}"
    assert CARD not in masking(app).text(error, "shop.loose", [payload], {})


def test_a_pair_naming_a_sensitive_key_is_masked(app: Celery) -> None:
    fields = {"fields": [("card_number", CARD), ("order", 15)], "form": [["cards", [CARD]]]}
    assert masking(app).value(fields) == {
        "fields": [("card_number", MASK), ("order", 15)],
        "form": [["cards", MASK]],
    }
    assert CARD not in masking(app).text(f"bad {CARD}", "shop.loose", [], fields)


def test_a_linked_tasks_positional_arguments_are_masked_by_its_parameters(app: Celery) -> None:
    link = app.tasks["shop.plain"].s(15, CARD)
    unknown = {"task": "shop.gone", "args": [CARD], "kwargs": {}, "options": {}}
    options = {"link": [dict(link)], "link_error": [{**unknown, "subtask_type": None}]}
    shown = masking(app).value(options)
    assert shown["link"][0]["args"] == [15, MASK]  # card_number, by its position
    assert shown["link_error"][0]["args"] == [MASK]  # an unknown position: masked
    assert CARD not in masking(app).text(f"bad {CARD}", "shop.loose", [], options)


def test_a_short_sensitive_value_is_masked_beside_its_name_only(app: Celery) -> None:
    app.conf.resilience_sensitive_keys = ["pin"]
    text = "retry 1 of 3 for order 1: pin=1 refused"
    assert masking(app).text(text, "shop.loose", [], {"pin": 1}) == (
        f"retry 1 of 3 for order 1: pin={MASK} refused"
    )
    assert masking(app).text("cvv 123", "shop.loose", [], {"pin": "123"}) == f"cvv {MASK}"


def test_task_modules_that_fail_to_import_are_tried_again_after_a_while(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[float] = []

    def broken() -> None:
        calls.append(now[0])
        raise ImportError("tasks.py is broken")

    now = [1000.0]
    monkeypatch.setattr(app.loader, "import_default_modules", broken)
    monkeypatch.setattr(known_tasks, "_clock", lambda: now[0], raising=False)
    for _ in range(5):  # an unknown task looked up again and again: one import, one log line
        assert not is_registered(app, "shop.gone")
    now[0] += known_tasks.RETRY_IMPORT_AFTER
    assert not is_registered(app, "shop.gone")
    assert calls == [1000.0, 1000.0 + known_tasks.RETRY_IMPORT_AFTER]


class GatewayError(Exception):
    """An error built from more than a message, shown through an attribute."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(code, text)
        self.code = code

    def __str__(self) -> str:
        return f"gateway {self.code}: {self.args[1]}"


@pytest.mark.parametrize("serializer", ["json", "pickle"])
def test_an_error_shown_masked_keeps_its_type_and_travels_whatever_its_constructor(
    app: Celery, serializer: str
) -> None:
    app.conf.resilience_error_text = "masked"
    cause = GatewayError(502, f"card {CARD} declined")
    shown = masking(app).exception(cause, "shop.plain", [15, CARD], {})
    assert isinstance(shown, GatewayError)  # what retry_on and park_on match
    assert (
        str(shown)
        == repr(shown)[len("GatewayError('") : -2]
        == f"gateway 502: card {MASK} declined"
    )
    again = pickle.loads(pickle.dumps(shown))  # a prefork pool's pipe
    assert isinstance(again, GatewayError)
    assert str(again) == str(shown)
    # The result backend records the type's own name, and reads back what it wrote.
    app.conf.result_serializer = serializer
    app.conf.result_accept_content = ["json", "pickle"]
    backend = BaseBackend(app)
    stored = backend.prepare_exception(shown)
    if serializer == "json":
        assert (stored["exc_module"], stored["exc_type"]) == (__name__, "GatewayError")
    else:
        assert type(stored) is type(shown)
    assert CARD not in repr(backend.exception_to_python(stored))


def test_a_bad_error_text_names_the_setting(app: Celery) -> None:
    app.conf.resilience_error_text = "some"
    with pytest.raises(ConfigurationError, match="resilience_error_text must be one of"):
        ResilienceConfig.from_app(app)
