# ruff: noqa: F811  # the fixtures imported below are redefined as the tests' parameters
"""What an on-call operator does in the admin: every replay and discard asks first and leaves a
trace, works over a whole filter, and the list says what is parked and what holds it.

Django's test client against the same app, stores and fixtures as ``test_django_admin.py``
(``tests/support/admin_world.py``; both stores: Redis and the database); the browser side is
``test_admin_browser.py``.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis

from celery_resilience import Resilience
from tests.support.admin_world import (  # noqa: F401  # fixtures, by name
    BREAKERS_URL,
    RECORD_URL,
    STORE_URL,
    act,
    admin_client,
    db_resilience,
    django_db,
    make_admin_app,
    park,
    published,
    resilience,
    row_of,
    text,
)

pytestmark = pytest.mark.integration


def list_url(res: Resilience) -> str:
    """The page that lists the app's entries: the table's while it parks in the database."""
    return RECORD_URL if res.runtime.app.conf.resilience_backout_store == "django" else STORE_URL


def log_entries() -> list[tuple[str, str, int, str, str]]:
    from django.contrib.admin.models import LogEntry

    return [
        (e.user.username, e.object_id, e.action_flag, e.object_repr, e.change_message)
        for e in LogEntry.objects.order_by("pk")
    ]


# -- asking first, and the trace ------------------------------------------------------------


def test_discard_asks_first_with_the_count_and_changes_nothing_until_confirmed(
    resilience: Resilience, admin_client: Any
) -> None:
    a, b = park(resilience, 1), park(resilience, 2)
    url = list_url(resilience)
    fields = {"action": "discard", "_selected_action": [a.id, b.id], "index": "0"}

    page = text(admin_client.post(url, fields))

    assert "These 2 tasks will never run" in page
    assert "Yes, discard 2" in page
    assert a.task_id in page
    assert b.task_id in page
    assert resilience.backout.count() == 2  # asking removed nothing
    assert log_entries() == []


def test_every_replay_and_discard_is_recorded_with_user_and_reason(
    resilience: Resilience,
    admin_client: Any,
    redis_client: redis.Redis,
    queue: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from django.contrib.admin.models import CHANGE, DELETION

    replayed, discarded = park(resilience, 1), park(resilience, 2)
    url = list_url(resilience)
    caplog.set_level(logging.INFO, logger="celery_resilience.admin")

    act(admin_client, url, "replay_now", [replayed.id], reason="gateway is back")
    act(admin_client, url, "discard", [discarded.id], reason="duplicate order,  refunded")

    assert log_entries() == [
        (
            "boss",
            replayed.id,
            CHANGE,
            f"{replayed.task_name}[{replayed.task_id}]",
            "Replayed from the admin. Reason: gateway is back",
        ),
        (
            "boss",
            discarded.id,
            DELETION,
            f"{discarded.task_name}[{discarded.task_id}]",
            "Discarded from the admin. Reason: duplicate order, refunded",
        ),
    ]
    logged = [r.getMessage() for r in caplog.records if r.name == "celery_resilience.admin"]
    assert (
        f"Replayed 1 parked task from the admin by boss (reason: gateway is back): {replayed.id}"
        in logged
    )
    assert (
        "Discarded 1 parked task from the admin by boss (reason: duplicate order, refunded): "
        f"{discarded.id}"
    ) in logged
    assert [m["id"] for m in published(redis_client, queue)] == [replayed.task_id]
    # The index's "Recent actions" shows them.
    home = text(admin_client.get("/admin/"))
    assert f"{replayed.task_name}[{replayed.task_id}]" in home


@pytest.mark.parametrize("right", ["replay", "delete"])
def test_replay_and_discard_are_two_permissions(
    resilience: Resilience,
    django_db: None,
    right: str,
) -> None:
    from django.contrib.auth.models import Permission, User
    from django.test import Client

    entry = park(resilience, 1)
    in_database = resilience.runtime.app.conf.resilience_backout_store == "django"
    model = "parkedtaskrecord" if in_database else "storeentry"
    user = User.objects.create_user("clerk", password="pw", is_staff=True)
    for codename in (f"view_{model}", f"{right}_{model}"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    url = list_url(resilience)

    page = text(client.get(url))
    assert ('value="replay_now"' in page) is (right == "replay")
    assert ('value="discard"' in page) is (right == "delete")
    forbidden = "discard" if right == "replay" else "replay_now"
    refused = client.post(
        url, {"action": forbidden, "_selected_action": [entry.id], "index": "0", "post": "yes"}
    )
    assert refused.status_code in (403, 302)  # Django's own changelist: back with a message
    assert resilience.backout.get(entry.id) is not None


def test_the_replay_permission_has_a_migration(django_db: None) -> None:
    from django.contrib.auth.models import Permission

    names = set(Permission.objects.values_list("codename", flat=True))
    assert {"replay_storeentry", "replay_parkedtaskrecord"} <= names


def test_a_drain_holding_the_lock_stops_a_bulk_replay_at_the_first_wait(
    make_admin_app: Callable[..., Resilience], admin_client: Any
) -> None:
    from celery_resilience.drain.lock import drain_lock

    res = make_admin_app("redis")
    entries = [park(res, n) for n in range(3)]
    with drain_lock(res.runtime, lease=60.0) as lock:
        assert lock is not None
        page = text(act(admin_client, STORE_URL, "replay_now", [e.id for e in entries]))

    assert "a drain holds the lock" in page
    assert "3 entries left parked" in page  # one wait, not three
    assert res.backout.count() == 3


# -- bulk work over a filter ------------------------------------------------------------------


def test_replay_all_matching_a_filter_covers_every_page(
    resilience: Resilience,
    admin_client: Any,
    redis_client: redis.Redis,
    queue: str,
) -> None:
    wanted = [park(resilience, n, breaker="mail") for n in range(130)]
    other = park(resilience, 500, breaker="payments")
    url = list_url(resilience)
    query = "?breaker__exact=mail" if url == RECORD_URL else "?breaker=mail"
    page = text(admin_client.get(url + query))
    assert "130" in page  # the total, kept under the filter

    fields: dict[str, str | list[str]] = {
        "action": "replay_now",
        "select_across": "1",
        "index": "0",
    }
    fields["_selected_action"] = [wanted[-1].id]  # Django's list sends the ticked page too
    asked = text(admin_client.post(url + query, fields))
    assert "Replay 130 parked tasks?" in asked
    assert "and 110 more." in asked
    done = admin_client.post(url + query, {**fields, "post": "yes"}, follow=True)

    assert "Replayed 130 parked tasks." in text(done)
    assert resilience.backout.count() == 1
    assert resilience.backout.get(other.id) is not None
    assert {m["id"] for m in published(redis_client, queue)} == {e.task_id for e in wanted}


# -- what the list says --------------------------------------------------------------------------


def test_the_list_shows_masked_arguments_the_error_and_the_dead_reason(
    resilience: Resilience, admin_client: Any
) -> None:
    secret = park(resilience, 15, kwargs={"order_id": 15, "card_token": "tok_live_4242"})
    hidden = park(resilience, 16, options={"argsrepr": "(<order>,)", "kwargsrepr": "{}"})
    dead = park(resilience, 17)
    resilience.backout.store.mark_dead(dead.id, "expired")

    page = text(admin_client.get(list_url(resilience)))

    assert "tok_live_4242" not in page
    assert "order_id=15, card_token=&#x27;***&#x27;" in page
    assert "&lt;order&gt;" in page  # Celery's argsrepr stands in for the arguments
    assert "ConnectionError: gateway refused 15" in page  # visible, not only on hover
    assert "dead: expired" in page
    detail = text(admin_client.get(f"{STORE_URL}{secret.id}/"))
    assert "tok_live_4242" not in detail
    assert "&quot;card_token&quot;: &quot;***&quot;" in detail
    assert hidden.id in page


def test_a_sensitive_argument_passed_by_position_is_masked_and_never_found(
    resilience: Resilience, admin_client: Any
) -> None:
    """``card_token`` is the task's second parameter: passed by position, it is masked in the
    list, the detail page, the error and the traceback that quote it, and no search finds it."""

    def pay(self: Any, order: int, card_token: str) -> None: ...

    resilience.runtime.app.task(name="shop.pay", bind=True, shared=False)(pay)
    token = "tok_live_4242"
    paid = park(
        resilience,
        15,
        id=f"a{uuid.uuid4().hex[1:]}",
        task_name="shop.pay",
        args=[15, token],
        kwargs={},
        exc_message=f"card {token} declined",
        traceback=f"Traceback (most recent call last):\nValueError: card {token} declined\n",
    )
    url = list_url(resilience)

    page = text(admin_client.get(url))
    assert token not in page
    assert "15, &#x27;***&#x27;" in page
    assert "card *** declined" in page
    detail = text(admin_client.get(f"{STORE_URL}{paid.id}/"))
    assert token not in detail
    assert "card *** declined" in detail
    for query in (token, "tok_live", "4242"):
        assert paid.id not in text(admin_client.get(url, {"q": query})), query
    assert paid.id in text(admin_client.get(url, {"q": "15"}))


def test_search_finds_an_order_by_its_number_not_ids_holding_it(
    resilience: Resilience, admin_client: Any
) -> None:
    fifteen = park(resilience, 15, id=f"a{uuid.uuid4().hex[1:]}", kwargs={"order_id": 15})
    # Entry ids are searched by their start too: the others' must not begin with "15" by chance.
    others = [
        park(resilience, n, id=f"a{uuid.uuid4().hex[1:]}", kwargs={"order_id": n})
        for n in (150, 115, 1)
    ]
    hex_15 = park(
        resilience,
        2,
        id=f"a{uuid.uuid4().hex[1:]}",
        task_id="15ab-not-an-order",
        kwargs={"order_id": 2},
    )
    url = list_url(resilience)

    def found(query: str) -> set[str]:
        page = text(admin_client.get(url, {"q": query}))
        return {e.id for e in (fifteen, *others, hex_15) if e.id in page}

    assert found("order_id=15") == {fifteen.id}
    assert found("15") == {fifteen.id, hex_15.id}  # the order, and a task id starting with it
    assert found("card") == set()
    assert found(fifteen.task_id) == {fifteen.id}


def test_a_filter_by_task_name(resilience: Resilience, admin_client: Any) -> None:
    charge = park(resilience, 1)
    refund = park(resilience, 2, task_name="shop.refund")
    in_database = resilience.runtime.app.conf.resilience_backout_store == "django"
    url = list_url(resilience)
    query = {"task_name": "shop.refund"} if in_database else {"task": "shop.refund"}

    page = text(admin_client.get(url, query))

    assert refund.id in page
    assert charge.id not in page
    assert "shop.refund" in text(admin_client.get(url))  # offered as a choice


# -- the breaker where it matters -----------------------------------------------------------


def test_entries_of_an_open_breaker_read_held_and_a_replay_warns(
    resilience: Resilience, admin_client: Any
) -> None:
    entry = park(resilience, 1, breaker="payments")
    resilience.breaker("payments").force_open()
    url = list_url(resilience)

    page = text(admin_client.get(url))
    assert "held: forced open" in page
    assert ">now<" not in page

    asked = text(
        admin_client.post(
            url, {"action": "replay_now", "_selected_action": [entry.id], "index": "0"}
        )
    )
    assert "Breaker “payments” is forced open" in asked
    assert "parked again" in asked
    assert resilience.backout.get(entry.id) is not None


def test_the_detail_page_finds_an_entry_by_its_celery_task_id(
    resilience: Resilience, admin_client: Any
) -> None:
    entry = park(resilience, 1, task_id="c0ffee00-1111-2222-3333-444455556666")
    in_database = resilience.runtime.app.conf.resilience_backout_store == "django"
    url = f"{RECORD_URL}{entry.task_id}/change/" if in_database else f"{STORE_URL}{entry.task_id}/"

    response = admin_client.get(url, follow=True)

    assert entry.id in response.redirect_chain[-1][0]
    assert entry.id in text(response)


# -- the breakers page -------------------------------------------------------------------------


def test_a_half_open_breaker_reads_probing_not_open_until_ago(
    make_admin_app: Callable[..., Resilience], admin_client: Any
) -> None:
    import time

    res = make_admin_app("redis")
    breaker = res.breaker("payments")
    for _ in range(3):  # tripped: open for its 30 s
        breaker.acquire().failure()
    assert breaker.state == "open"
    # the stored deadline moved 55 s into the past, as 85 s of waiting would
    res.runtime.redis.hset(
        f"{{{res.runtime.config.key_prefix}:breaker:payments}}:state",
        "open_until",
        int((time.time() - 55) * 1e6),
    )

    row = row_of(text(admin_client.get(BREAKERS_URL)), "payments")

    assert row["state"] == "half_open"
    assert row["open_until"] == "probing now"
    assert "ago" not in row["open_until"]


def test_force_open_for_a_maintenance_window_with_a_note(
    make_admin_app: Callable[..., Resilience], admin_client: Any
) -> None:
    from celery_resilience import maintenance

    res = make_admin_app("redis")
    form = text(admin_client.get(f"{BREAKERS_URL}payments/open/"))
    assert 'name="minutes"' in form

    done = admin_client.post(
        f"{BREAKERS_URL}payments/open/",
        {"reason": "gateway upgrade, ticket OPS-12", "minutes": "10"},
        follow=True,
    )

    page = text(done)
    assert "Breaker “payments” forced open until" in page
    row = row_of(page, "payments")
    assert row["state"] == "forced_open"
    assert re.fullmatch(r"in (9|10)\xa0minutes", row["open_until"]), row["open_until"]
    assert row["note"] == "gateway upgrade, ticket OPS-12 (boss)"
    assert f'href="{BREAKERS_URL}payments/open/"' not in page  # forced open already
    window = maintenance.windows(res.runtime)["payments"]
    assert window.until is not None
    assert 595 < window.until - res.runtime.now() <= 600
    assert log_entries()[-1][4].startswith("Forced open until ")
    # Any other lever ends the window.
    admin_client.post(f"{BREAKERS_URL}payments/reset/")
    assert maintenance.windows(res.runtime) == {}


def test_a_bad_window_changes_nothing(
    make_admin_app: Callable[..., Resilience], admin_client: Any
) -> None:
    res = make_admin_app("redis")
    for minutes in ("soon", "0", str(7 * 24 * 60 + 1)):
        page = text(
            admin_client.post(f"{BREAKERS_URL}payments/open/", {"minutes": minutes}, follow=True)
        )
        assert "Minutes must be" in page
        assert res.breaker("payments").state == "closed"


def test_the_breakers_page_with_redis_down_does_not_claim_no_breakers(
    make_admin_app: Callable[..., Resilience], admin_client: Any
) -> None:
    make_admin_app("redis", redis_at="redis://127.0.0.1:1/15")

    page = text(admin_client.get(BREAKERS_URL))

    assert 'id="breakers-error"' in page
    assert "No breakers" not in page
    assert "Breakers unknown" in page


# -- the overview -------------------------------------------------------------------------------

OVERVIEW_URL = "/admin/celery_resilience/overview/"


def test_the_overview_counts_per_breaker_and_reason_and_names_the_oldest(
    resilience: Resilience, admin_client: Any
) -> None:
    oldest = park(resilience, 1, breaker="payments", parked_at=1_600_000_000.0)
    park(resilience, 2, breaker="payments", reason="retries_exhausted")
    park(resilience, 3, breaker="payments")
    dead = park(resilience, 4, breaker="mail", reason="park_on")
    resilience.backout.store.mark_dead(dead.id, "expired")

    page = text(admin_client.get(OVERVIEW_URL))

    assert "3 parked, 1 dead" in page
    pay = row_of(page, "payments")
    assert pay["total"] == "3"
    assert row_of(page, "mail")["dead"] == "1"
    cells = re.findall(
        r'<td class="field-reason numeric">(.*?)</td>',
        re.search(r'<tr data-breaker="payments">(.*?)</tr>', page, re.S)[1],  # type: ignore[index]
    )
    counts = [re.sub(r"<[^>]+>", "", c) for c in cells]
    assert counts[:2] == ["2", "1"]  # breaker_open, retries_exhausted
    assert f"{oldest.task_name}[{oldest.task_id}]" in page
    assert "no sign of beat" in page  # nothing ran the drain task here
    assert "none running now" in page
    assert "Overview" in text(admin_client.get("/admin/"))


def test_the_overview_says_beat_is_alive_once_the_drain_task_ran(
    make_admin_app: Callable[..., Resilience], admin_client: Any
) -> None:
    res = make_admin_app("redis")
    res.runtime.app.tasks["celery_resilience.drain"].apply()

    page = text(admin_client.get(OVERVIEW_URL))

    assert re.search(r"alive</span>: the drain task ran \d+\xa0seconds? ago", page), page
    assert "Last drain" in page
    assert "never" not in page


def test_the_overview_with_redis_down_says_so_and_claims_no_zeros(
    make_admin_app: Callable[..., Resilience], admin_client: Any
) -> None:
    make_admin_app("redis", redis_at="redis://127.0.0.1:1/15")

    page = text(admin_client.get(OVERVIEW_URL))

    assert "Could not read" in page
    assert "Nothing is parked" not in page
    assert "0 parked" not in page
    assert "none configured" not in page
