"""Charging an order through the shared ``payments`` breaker.

What happens to one delivery of ``charge_order`` (all of it is ``ResilientTask``'s work):

* the gateway answers: the order is charged; ``deduplicate=True`` remembers the task id, so a
  replay or a duplicate message of the same task id is skipped;
* the gateway is down (``retry_on``): the failure counts toward the breaker, and the task is
  retried with jittered exponential backoff (0.2 s, 0.4 s, 0.8 s... at most 2 s), 3 times at
  most, then parked with reason ``retries_exhausted``;
* the breaker is open (5 failures in a row, from any worker): the task is parked at once,
  without calling the gateway (reason ``breaker_open``); beat's ``celery_resilience.drain``
  replays it, with the same task id, once the breaker admits calls again;
* the gateway hangs: the client's timeout, or the task's ``soft_time_limit`` when that comes first,
  ends the call as a breaker failure (retried, then parked); the breaker's bulkhead
  (``max_concurrent_calls``) keeps a hung gateway to one pool slot, and a charge that finds the
  slot taken is parked at once, without calling it;
* the card is declined (``PaymentDeclined``): a normal Celery FAILURE, the order is ``failed``.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from celery.signals import task_failure
from celery_resilience import ParkedTask, ResilientTask, backoff
from celery_resilience.signals import task_parked
from django.db.models import F

from . import payments
from .models import Order

CHARGE_TASK = "orders.charge_order"


@shared_task(
    name=CHARGE_TASK,
    base=ResilientTask,
    bind=True,
    acks_late=True,
    breaker="payments",
    retry_on=(ConnectionError, TimeoutError, payments.GatewayUnavailable),
    max_retries=3,
    backoff=backoff.Exponential(base=0.2, cap=2.0, jitter="full"),
    deduplicate=True,
    # A hung gateway call ends here at the latest: counted as a breaker failure and retried or
    # parked like a timeout, never a FAILURE (the client's own timeout normally ends it first).
    soft_time_limit=1.5,
    # And the pool child is killed here at the latest: the claim on the task id (deduplicate)
    # lasts this plus 10 s, not resilience_dedup_lease (600 s), should the worker die whole.
    time_limit=5.0,
)
def charge_order(self: ResilientTask, order_id: int) -> dict[str, Any]:
    order = Order.objects.get(pk=order_id)
    if order.status == Order.Status.CHARGED:  # charged by an earlier delivery: never twice
        return {"order_id": order_id, "charge_id": order.charge_id, "already": True}
    Order.objects.filter(pk=order_id).update(attempts=F("attempts") + 1)
    receipt = payments.charge(order_id, order.amount)
    Order.objects.filter(pk=order_id).update(
        status=Order.Status.CHARGED,
        charge_count=F("charge_count") + 1,
        charge_id=receipt["charge_id"],
    )
    return {"order_id": order_id, "charge_id": receipt["charge_id"]}


def _order_id(args: Any, kwargs: Any) -> Any:
    return args[0] if args else (kwargs or {}).get("order_id")


# An order is "parked" when its charge is in the back-out store: the package's task_parked
# signal says so once the entry is stored. (Celery's IGNORED state says less: a delivery that
# waits in the broker for a claim on its task id, or is skipped because it already succeeded,
# ends with Ignore too.) Only a pending order becomes "parked".
@task_parked.connect(dispatch_uid="orders.note_parked")
def _note_parked(sender: Any = None, entry: ParkedTask | None = None, **_: Any) -> None:
    if getattr(sender, "name", None) == CHARGE_TASK and entry is not None:
        Order.objects.filter(
            pk=_order_id(entry.args, entry.kwargs), status=Order.Status.PENDING
        ).update(status=Order.Status.PARKED)


@task_failure.connect(dispatch_uid="orders.note_failed")
def _note_failed(sender: Any = None, args: Any = None, kwargs: Any = None, **_: Any) -> None:
    if getattr(sender, "name", None) == CHARGE_TASK:
        Order.objects.filter(pk=_order_id(args, kwargs)).exclude(
            status=Order.Status.CHARGED
        ).update(status=Order.Status.FAILED)
