"""What a person reads of a parked task's arguments: masked, Celery's reprs honoured, one line."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_resilience import ConfigurationError
from celery_resilience.backout.entry import ParkedTask
from celery_resilience.backout.masking import EVERYTHING, MASK, Masking, Positions
from celery_resilience.backout.summary import SEALED, arguments, summary
from celery_resilience.config import ResilienceConfig

pytestmark = pytest.mark.unit


def masking(*keys: str) -> Masking:
    """Masking of ``keys`` for a task whose first positional parameter is ``order``."""
    return Masking(keys, positions=lambda task_name: Positions(("order",)))


def entry(args: list[Any] | None = None, **fields: Any) -> ParkedTask:
    return ParkedTask.new(
        task_name="shop.charge", task_id="tid", reason="breaker_open", args=args or [], **fields
    )


def test_a_sensitive_keyword_reads_masked_and_the_others_in_clear() -> None:
    parked = entry([15], kwargs={"card_token": "tok_live_4242", "amount": 990})
    shown = arguments(parked, masking("card_token"))
    assert shown == f"15, card_token='{MASK}', amount=990"
    assert "tok_live_4242" not in shown


def test_a_sensitive_key_is_masked_at_any_depth_and_whatever_its_case() -> None:
    parked = entry([{"order": 15, "payment": {"Card_Token": "tok_x", "last4": "4242"}}])
    assert arguments(parked, masking("card_token")) == (
        "{'order': 15, 'payment': {'Card_Token': '***', 'last4': '4242'}}"
    )


def test_celerys_argsrepr_and_kwargsrepr_are_shown_instead_of_the_arguments() -> None:
    parked = entry(
        ["secret"],
        kwargs={"password": "hunter2"},
        options={"argsrepr": "('<redacted>',)", "kwargsrepr": "{'password': '...'}"},
    )
    shown = arguments(parked)
    assert shown == "'<redacted>', **{'password': '...'}"
    assert "hunter2" not in shown
    assert "secret" not in shown


def test_a_summary_is_one_line_cut_to_its_width() -> None:
    parked = entry(["a\nb" * 40])
    line = summary(parked, width=30)
    assert len(line) == 30
    assert line.endswith("…")
    assert "\n" not in line


def test_an_entry_read_without_its_key_says_encrypted() -> None:
    sealed = ParkedTask(**{**entry().__dict__, "encrypted": True})
    assert summary(sealed) == SEALED


def test_masking_leaves_the_value_itself_alone() -> None:
    kwargs = {"card_token": "tok"}
    assert masking("card_token").value(kwargs) == {"card_token": MASK}
    assert kwargs == {"card_token": "tok"}
    assert Masking().value(kwargs) is kwargs


def test_sensitive_keys_is_a_list_of_names_and_a_bad_one_names_the_setting() -> None:
    app = Celery("t", broker="memory://")
    app.conf.resilience_redis_url = "memory://"
    app.conf.resilience_sensitive_keys = ["Card_Token", "password"]
    assert ResilienceConfig.from_conf(app.conf).sensitive_keys == ("card_token", "password")
    app.conf.resilience_sensitive_keys = ["card_token", 5]
    with pytest.raises(ConfigurationError, match="resilience_sensitive_keys"):
        ResilienceConfig.from_conf(app.conf)


def test_the_log_line_of_a_task_that_could_not_be_parked_masks_its_arguments(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The last record of a task whose every park failed: it names the call, masked."""
    from types import SimpleNamespace

    from celery_resilience import Resilience, ResilientTask
    from celery_resilience.delivery.kept import give_up

    app = Celery("summary-give-up", broker="memory://", set_as_current=False)
    app.conf.resilience_sensitive_keys = ["card_token"]

    # a name of its own: Celery warns of a second callable under a name another module's
    # shared task holds (test_django_admin's shop.charge), and keeps the first
    @app.task(base=ResilientTask, name="summary.charge", shared=False)
    def charge(order_id: int, card_token: str = "") -> None: ...

    request = SimpleNamespace(id="t-1", args=[15], kwargs={"card_token": "tok_live_4242"})
    delivery = app.tasks["summary.charge"]._delivery(request)
    assert delivery.runtime is Resilience.for_app(app).runtime
    caplog.set_level("ERROR", logger="celery_resilience")
    give_up(delivery, "breaker_open", 10, ConnectionError("down"))
    (line,) = [r.getMessage() for r in caplog.records if "Gave up parking" in r.getMessage()]
    assert "called with (15, card_token='***')" in line
    assert "tok_live_4242" not in line


def test_every_value_is_masked_when_the_keys_cannot_be_read() -> None:
    parked = entry([15], kwargs={"card_token": "tok", "nested": {"x": 1}})
    shown = arguments(parked, EVERYTHING)
    assert shown == f"'{MASK}', card_token='{MASK}', nested='{MASK}'"
