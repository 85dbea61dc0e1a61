"""The key ``breaker_key`` and ``deduplicate`` render from a delivery's arguments
(``delivery/argument_key.py``): one rendering for both options."""

from __future__ import annotations

from typing import Any

import pytest

from celery_resilience.delivery.argument_key import render

pytestmark = pytest.mark.unit


def charge(order_id: str, currency: str = "EUR", *, note: str | None = None) -> None:
    return None


def notify(host: str, **kwargs: Any) -> None:
    return None


@pytest.mark.parametrize(
    ("run", "option", "args", "kwargs", "key"),
    [
        (charge, "{order_id}:{currency}", ("o-1",), {}, "o-1:EUR"),  # the body's default
        (charge, "{order_id}:{currency}", ("o-1", "USD"), {}, "o-1:USD"),
        (charge, "{order_id}:{currency}", (), {"order_id": "o-1"}, "o-1:EUR"),
        (notify, "{host}/{tenant}", ("h1",), {"tenant": "t9"}, "h1/t9"),  # **kwargs by name
        (charge, lambda order_id, **_: f"x{order_id}", ("o-1",), {}, "xo-1"),
        (charge, "{order_id[0]}", ("o-1",), {}, "o"),
    ],
)
def test_a_key_is_rendered_as_the_body_would_bind_its_arguments(
    run: Any, option: Any, args: tuple[Any, ...], kwargs: dict[str, Any], key: str
) -> None:
    assert render(run, option, args, kwargs) == key


@pytest.mark.parametrize(
    ("option", "args", "kwargs"),
    [
        ("{order_id}:{note}", ("o-1",), {}),  # a field whose value is None
        (lambda *a, **k: None, ("o-1",), {}),
        (lambda *a, **k: "", ("o-1",), {}),
        ("{missing}", ("o-1",), {}),  # a field naming no argument given
    ],
)
def test_a_key_of_nothing_or_of_a_missing_argument_is_refused(
    option: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    with pytest.raises((ValueError, KeyError)):
        render(charge, option, args, kwargs)
