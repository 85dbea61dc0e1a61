"""The Django admin where an encryption key is missing: it says "encrypted", shows nothing
sealed, and still lists the entry (the admin's fixtures, on the configured Redis store)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from cryptography.fernet import Fernet

from celery_resilience import ParkedTask, Resilience
from celery_resilience.backout import Codec, RedisBackoutStore
from tests import test_django_admin as admin_tests
from tests.test_django_admin import STORE_URL, TASK, text

pytestmark = pytest.mark.integration

#: The admin suite's fixtures: a superuser's client, an app the admin finds, its database.
admin_client, django_db, make_resilience, queue = (
    admin_tests.admin_client,
    admin_tests.django_db,
    admin_tests.make_resilience,
    admin_tests.queue,
)
SECRET = "QZJX-VKWY-PQXJ-ZKVW"


def test_the_detail_page_says_encrypted_where_the_admin_has_no_key(
    make_resilience: Callable[[str], Resilience], admin_client: Any
) -> None:
    res = make_resilience("redis")  # the admin's app: no encryption key
    keyed = RedisBackoutStore(
        res.runtime.redis,
        res.runtime.config.key_prefix,
        codec=Codec("json", (), (Fernet.generate_key(),)),
    )
    entry = ParkedTask.new(
        task_name=TASK,
        task_id="sealed-order",
        reason="breaker_open",
        breaker="payments",
        args=[SECRET],
        kwargs={"card": SECRET},
        exc_type="builtins.ConnectionError",
        exc_message=f"refused {SECRET}",
    )
    keyed.park(entry)
    listing = text(admin_client.get(STORE_URL))
    assert "sealed-order" in listing
    assert SECRET not in listing
    page = text(admin_client.get(f"{STORE_URL}{entry.id}/"))
    assert "sealed-order" in page
    assert "encrypted (this process has no key that opens it)" in page
    assert "builtins.ConnectionError: encrypted" in page
    assert SECRET not in page
