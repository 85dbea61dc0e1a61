"""The shop's checkout: a Django (sync) view on the same ``payments`` breaker as the workers.

The page never calls the gateway: it saves the order and queues ``charge_order``. What it tells
the customer depends on the breaker the workers share. While it admits calls, the order is
confirmed; while it does not (open, half-open, forced open), the order is queued all the same,
and the page says the payment will come later instead of promising it now. The state is read
with ``Breaker.known_state()``: this process's view, kept current by the change feed, so a page
costs no Redis round trip while the feed is live (one, the first time, or after the feed was
lost).
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from celery_resilience import Resilience, StoreUnavailable
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods

from shop.celery import app

from .models import Order
from .tasks import charge_order

#: States in which the breaker admits every call: a charge queued now runs at once.
ADMITTING = ("closed", "forced_closed")


def payments_admitting() -> bool:
    """Does the ``payments`` breaker admit calls, as far as this process knows?"""
    try:
        return Resilience.for_app(app).breaker("payments").known_state() in ADMITTING
    except StoreUnavailable:
        return False  # unknown: promise nothing; the task itself follows resilience_on_redis_error


@require_http_methods(["GET", "POST"])
def checkout(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return render(request, "orders/checkout.html", {"amount": "25.00"})
    try:
        amount = Decimal(request.POST.get("amount", ""))
    except InvalidOperation:
        amount = Decimal(0)
    if not amount.is_finite() or amount <= 0:
        context = {"amount": request.POST.get("amount", ""), "error": "Enter an amount above 0."}
        return render(request, "orders/checkout.html", context, status=400)
    order = Order.objects.create(amount=amount.quantize(Decimal("0.01")))
    charge_order.delay(order.pk)  # queued either way: parked and replayed if payments are down
    context = {"order": order, "delayed": not payments_admitting()}
    return render(request, "orders/placed.html", context)
