"""``python manage.py place_orders 50``: create orders and send a charge task for each."""

import random
from decimal import Decimal
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from orders.models import Order
from orders.tasks import charge_order


class Command(BaseCommand):
    help = "Create COUNT orders and queue a charge for each."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("count", type=int, nargs="?", default=10)

    def handle(self, *args: Any, count: int, **options: Any) -> None:
        orders = Order.objects.bulk_create(
            Order(amount=Decimal(random.randrange(500, 20000)) / 100) for _ in range(count)
        )
        for order in orders:
            charge_order.delay(order.pk)
        self.stdout.write(f"Queued {len(orders)} charges (orders {orders[0].pk}..{orders[-1].pk})")
