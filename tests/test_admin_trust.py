# ruff: noqa: F811  # the fixtures imported below are redefined as the tests' parameters
"""The Django admin where an encryption key is missing: it says "encrypted", shows nothing
sealed, and still lists the entry (the admin's fixtures, on the configured Redis store)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from cryptography.fernet import Fernet

from celery_resilience import ParkedTask, Resilience
from celery_resilience.backout import Codec, RedisBackoutStore
from tests.support.admin_world import (  # noqa: F401  # fixtures, by name
    RECORD_URL,
    STORE_URL,
    TASK,
    act,
    admin_client,
    django_db,
    make_admin_app,
    park,
    text,
)

pytestmark = pytest.mark.integration

SECRET = "QZJX-VKWY-PQXJ-ZKVW"


def test_the_detail_page_says_encrypted_where_the_admin_has_no_key(
    make_admin_app: Callable[[str], Resilience], admin_client: Any
) -> None:
    res = make_admin_app("redis")  # the admin's app: no encryption key
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


@pytest.mark.parametrize("store", ["redis", "django"])
def test_re_check_parks_again_what_another_process_quarantined_and_says_why_not_the_rest(
    make_admin_app: Callable[[str], Resilience], admin_client: Any, store: str
) -> None:
    """A process of another release, or with other keys, marked good entries dead; the admin's
    app reads them: "Re-check" parks them again, and gives its own reason for the others."""
    from tests.support.raw_entries import put_raw

    res = make_admin_app(store)
    backout = res.runtime.backout_store
    recent = time.time() - 60  # well within its signed lifetime
    good, garbage, other = (park(res, n, parked_at=recent) for n in (1, 2, 3))
    backout.mark_dead(good.id, "undecodable")
    put_raw(backout, garbage.id, b"\xff not an entry")
    backout.mark_dead(garbage.id, "tampered")
    backout.mark_dead(other.id, "max_replays")  # not a reason a re-check changes
    url = RECORD_URL if store == "django" else STORE_URL
    page = text(act(admin_client, url, "recheck", [good.id, garbage.id, other.id]))
    assert "Parked again 1 entry" in page
    assert "1 entry left alone" in page
    assert f"{garbage.id}: entry {garbage.id} can&#x27;t be decoded" in page
    assert res.backout.get(good.id).status == "parked"  # type: ignore[union-attr]
    assert res.backout.get(garbage.id).status == "dead"  # type: ignore[union-attr]
    assert res.backout.get(other.id).dead_reason == "max_replays"  # type: ignore[union-attr]
