"""A task module that only autodiscovery / ``imports`` loads (see test_drain_registration)."""

from celery import shared_task


@shared_task(name="lazy.charge")
def charge(order_id: int) -> int:
    return order_id
