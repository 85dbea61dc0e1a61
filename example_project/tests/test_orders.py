"""The shop's charge task against the real gateway: charged once, parked while it is down,
replayed by the drain once it is back, never charged twice."""

from __future__ import annotations

import time
import uuid
from decimal import Decimal
from typing import Any

from celery import states
from celery_resilience import Resilience
from celery_resilience.contrib.pytest import ResilienceHarness

from gateway import Gateway
from orders.models import Order
from orders.tasks import charge_order


def new_order(amount: str = "12.50") -> Order:
    return Order.objects.create(amount=Decimal(amount))


def status(order: Order) -> str:
    order.refresh_from_db()
    return order.status


def test_django_settings_reach_the_package(app: Any, shop: ResilienceHarness) -> None:
    config = shop.resilience.runtime.config
    assert config.breaker("payments").failure_threshold == 5  # CELERY_RESILIENCE_BREAKERS
    assert config.key_prefix == "shop-tests"  # CELERY_RESILIENCE_KEY_PREFIX
    assert config.drain_rate == 100.0
    assert app.conf.task_acks_late
    assert app.conf.task_reject_on_worker_lost
    assert app.conf.result_backend == "django-db"
    assert app.conf.result_extended
    # The settings spell out the entry the package would make.
    drain = app.conf.beat_schedule["celery-resilience-drain"]
    assert drain == Resilience(app, config=config).beat_schedule(every=2.0)
    task = app.tasks["orders.charge_order"]
    assert (task.breaker, task.max_retries, task.deduplicate) == ("payments", 3, True)


def test_an_order_is_charged_once_even_if_delivered_twice(
    shop: ResilienceHarness, gateway: Gateway
) -> None:
    order = new_order()
    task_id = uuid.uuid4().hex
    result = charge_order.apply_async((order.pk,), task_id=task_id)
    assert result.state == states.SUCCESS
    assert status(order) == "charged"
    # The same message again (a replay, a redelivery): deduplicate=True skips it.
    again = charge_order.apply_async((order.pk,), task_id=task_id)
    assert again.state == states.IGNORED
    assert gateway.ledger()["charges"] == {str(order.pk): 1}
    assert shop.state("payments") == "closed"


def test_an_outage_parks_orders_and_the_drain_charges_each_once(
    shop: ResilienceHarness, gateway: Gateway
) -> None:
    gateway.down("refuse")
    first, second, third = new_order(), new_order(), new_order()
    charge_order.delay(first.pk)  # 1 try + 3 retries, all refused: parked, breaker still closed
    [entry] = shop.parked(breaker="payments")
    assert (entry.reason, entry.retries) == ("retries_exhausted", 3)
    assert entry.exc_type.endswith("ConnectionRefusedError")
    charge_order.delay(second.pk)  # the 5th failure in a row opens the breaker
    assert shop.state("payments") == "open"
    charge_order.delay(third.pk)  # parked at once: the gateway is not called
    reasons = sorted(e.reason for e in shop.parked(breaker="payments"))
    assert reasons == ["breaker_open", "breaker_open", "retries_exhausted"]
    assert [status(o) for o in (first, second, third)] == ["parked"] * 3

    gateway.up()
    assert shop.drain().replayed == 0  # still open: nothing leaves the store
    # An entry parked after its last retry is due after one more backoff delay (<= 1.6 s), and
    # the breaker lets a probe through once its open timeout has run.
    open_until = shop.breaker("payments").snapshot()["open_until"]
    due = max(open_until, *(e.due_at for e in shop.parked()))
    time.sleep(max(0.25, due - time.time() + 0.05))
    report = shop.drain()  # one probe succeeds, the breaker closes, the rest follows
    assert (report.replayed, report.dead) == (3, 0)
    assert shop.state("payments") == "closed"
    assert shop.parked() == []
    assert [status(o) for o in (first, second, third)] == ["charged"] * 3
    assert gateway.ledger()["charges"] == {str(o.pk): 1 for o in (first, second, third)}


def test_an_open_breaker_spares_the_gateway(shop: ResilienceHarness, gateway: Gateway) -> None:
    shop.force_open("payments")
    order = new_order()
    charge_order.delay(order.pk)
    [entry] = shop.parked(breaker="payments")
    assert (entry.reason, entry.args) == ("breaker_open", [order.pk])
    assert gateway.ledger()["counts"] == {}  # not a single request reached it
    order.refresh_from_db()
    assert (order.status, order.attempts) == ("parked", 0)


def test_503_is_transient_too(shop: ResilienceHarness, gateway: Gateway) -> None:
    gateway.down("503")
    order = new_order()
    charge_order.delay(order.pk)
    [entry] = shop.parked(breaker="payments")
    assert entry.exc_type.endswith("GatewayUnavailable")
    assert gateway.ledger()["counts"]["unavailable"] == 4  # first try and 3 retries


def test_a_declined_card_fails_the_order_without_retry_or_park(
    shop: ResilienceHarness, gateway: Gateway
) -> None:
    order = new_order("-5.00")  # the gateway declines negative amounts
    result = charge_order.delay(order.pk)
    assert result.state == states.FAILURE
    assert type(result.result).__name__ == "PaymentDeclined"
    order.refresh_from_db()
    assert (order.status, order.attempts) == ("failed", 1)
    assert shop.parked() == []
    assert shop.breaker("payments").snapshot()["consecutive_failures"] == 0
