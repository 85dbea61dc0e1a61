"""The client of the payment gateway: one POST per charge, errors sorted by what they mean.

Transient (the gateway is down or overloaded; try again later): ``ConnectionError`` (refused,
reset), ``TimeoutError``, :class:`GatewayUnavailable` (5xx, 429, a garbled answer).
Permanent: :class:`PaymentDeclined` (4xx): retrying would not help.
"""

from __future__ import annotations

import http.client
import json
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings


class GatewayUnavailable(Exception):
    """The gateway answered, but can't take the charge now (5xx, 429, a broken reply)."""


class PaymentDeclined(Exception):
    """The gateway refused the charge for good (4xx): not retried."""


def charge(order_id: int, amount: Decimal | float | str) -> dict[str, Any]:
    """Charge ``amount`` for ``order_id`` (its idempotency key); the gateway's receipt."""
    url = urlsplit(settings.PAYMENTS_GATEWAY_URL)
    body = json.dumps({"order_id": order_id, "amount": str(amount)})
    headers = {"Content-Type": "application/json", "Idempotency-Key": str(order_id)}
    connection = http.client.HTTPConnection(
        url.hostname or "127.0.0.1", url.port or 80, timeout=settings.PAYMENTS_TIMEOUT
    )
    try:
        connection.request("POST", "/charges", body=body, headers=headers)
        response = connection.getresponse()
        status, raw = response.status, response.read()
    except http.client.HTTPException as exc:  # not ConnectionError: a garbled reply
        raise GatewayUnavailable(f"bad answer from the gateway: {exc!r}") from exc
    finally:
        connection.close()
    if status >= 500 or status == 429:
        raise GatewayUnavailable(f"gateway answered {status}")
    if status >= 400:
        raise PaymentDeclined(f"gateway answered {status}: {raw[:200]!r}")
    receipt: dict[str, Any] = json.loads(raw)
    return receipt
