# ruff: noqa: F811  # the fixtures imported below are redefined as the tests' parameters
"""The admin shows, replays and discards the parked tasks of the app's configured store, and
shows and steers its shared breakers.

Django's test client, logged in as a superuser, against the ``default`` test database
(``RESILIENCE_TEST_DB``). The Celery app uses Redis database 15 under a fresh key prefix and
a queue of its own; "Replay now" is checked by reading the published message from that queue,
and a breaker's change by a second app on the same Redis and prefix.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from celery_resilience import RateLimited, Resilience
from tests.support import admin_world
from tests.support.admin_world import (  # noqa: F401  # fixtures, by name
    BREAKERS,
    BREAKERS_URL,
    RECORD_URL,
    STORE_URL,
    TASK,
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
from tests.support.round_trips import lasting_knowledge

pytestmark = pytest.mark.integration

# -- the configured store's page ------------------------------------------------------------


def test_the_index_links_only_the_store_in_use(resilience: Resilience, admin_client: Any) -> None:
    page = text(admin_client.get("/admin/"))
    in_database = resilience.runtime.app.conf.resilience_backout_store == "django"
    assert ("Parked task records (database store)" in page) is in_database
    assert (RECORD_URL in page) is in_database
    assert ("Parked tasks (configured store)" in page) is not in_database
    assert (STORE_URL in page) is not in_database
    assert f"{STORE_URL}add/" not in page  # read-only
    assert f"{RECORD_URL}add/" not in page
    assert BREAKERS_URL in page
    assert f"{BREAKERS_URL}add/" not in page


def test_list_shows_the_configured_stores_entries(
    resilience: Resilience, admin_client: Any
) -> None:
    entries = [park(resilience, n) for n in range(3)]
    page = text(admin_client.get(STORE_URL))
    for e in entries:
        assert e.id in page
        assert e.task_id in page
    assert "3 entries" in page
    # Newest first, as the store lists them.
    assert page.index(entries[2].id) < page.index(entries[1].id) < page.index(entries[0].id)


def test_the_page_shows_the_right_store_kind(resilience: Resilience) -> None:
    from celery_resilience.backout import RedisBackoutStore
    from celery_resilience.contrib.django.store import DjangoBackoutStore

    kind = resilience.runtime.app.conf.resilience_backout_store
    expected = DjangoBackoutStore if kind == "django" else RedisBackoutStore
    assert isinstance(resilience.runtime.backout_store, expected)


def test_filters_narrow_the_list(resilience: Resilience, admin_client: Any) -> None:
    pay = park(resilience, 1, breaker="payments", reason="breaker_open")
    mail = park(resilience, 2, breaker="mail", reason="retries_exhausted")
    bare = park(resilience, 3, breaker=None, reason="park_on")
    dead = park(resilience, 4, breaker="payments", reason="retries_exhausted")
    resilience.backout.store.mark_dead(dead.id, "max_replays")

    def listed(query: str) -> set[str]:
        page = text(admin_client.get(STORE_URL + query))
        return {e.id for e in (pay, mail, bare, dead) if e.id in page}

    assert listed("") == {pay.id, mail.id, bare.id, dead.id}
    assert listed("?breaker=payments") == {pay.id, dead.id}
    assert listed("?breaker=-") == {bare.id}
    assert listed("?reason=retries_exhausted") == {mail.id, dead.id}
    assert listed("?status=dead") == {dead.id}
    assert listed("?status=parked&breaker=payments") == {pay.id}
    page = text(admin_client.get(STORE_URL + "?status=bogus"))
    assert "Unknown status" in page  # ignored with a message, not a server error
    assert "mail" in text(admin_client.get(STORE_URL))  # breakers are offered as filters


def test_search_by_task_name_and_task_id(resilience: Resilience, admin_client: Any) -> None:
    charge_entry = park(resilience, 1)
    refund = park(resilience, 2, task_name="shop.refund", task_id="refund-77")

    def found(query: str) -> set[str]:
        page = text(admin_client.get(STORE_URL, {"q": query}))
        return {e.id for e in (charge_entry, refund) if e.id in page}

    assert found("refund") == {refund.id}
    assert found("REFUND-77") == {refund.id}
    assert found(charge_entry.task_id) == {charge_entry.id}
    assert found("shop.") == {charge_entry.id, refund.id}
    assert found("nothing-like-it") == set()


def test_pages_of_entries(resilience: Resilience, admin_client: Any) -> None:
    entries = [park(resilience, n) for n in range(105)]
    first = text(admin_client.get(STORE_URL))
    assert entries[104].id in first
    assert entries[4].id not in first
    assert 'id="next-page"' in first
    assert 'id="last-page"' in first
    assert "page 1 of 2" in first
    second = text(admin_client.get(STORE_URL, {"p": 2}))
    assert {e.id for e in entries[:5]} == {e.id for e in entries if e.id in second}
    assert 'id="next-page"' not in second
    assert 'id="first-page"' in second
    assert "page 2 of 2" in second
    assert "105 entries" in second


def test_detail_page_shows_args_kwargs_options_and_traceback(
    resilience: Resilience, admin_client: Any
) -> None:
    e = park(resilience, 7, args=[7, "naïve ☃"], kwargs={"note": "<b>fragile</b>"})
    page = text(admin_client.get(f"{STORE_URL}{e.id}/"))
    assert e.task_id in page
    assert "naïve ☃" in page
    assert "&lt;b&gt;fragile&lt;/b&gt;" in page  # escaped, never rendered as HTML
    assert "&quot;time_limit&quot;: 60" in page
    assert "builtins.ConnectionError: gateway refused 7" in page
    assert "frame-7" in page
    assert 'id="entry-replay_now"' in page
    assert 'id="entry-discard"' in page


def test_detail_of_a_missing_entry_goes_back_to_the_list(
    resilience: Resilience, admin_client: Any
) -> None:
    response = admin_client.get(f"{STORE_URL}{'0' * 32}/", follow=True)
    page = text(response)
    assert "is not in the store" in page
    assert response.redirect_chain[-1][0] == STORE_URL


def test_replay_now_publishes_and_removes_the_entry(
    resilience: Resilience, admin_client: Any, redis_client: redis.Redis, queue: str
) -> None:
    kept, replayed = park(resilience, 1), park(resilience, 2)
    response = act(admin_client, STORE_URL + "?breaker=payments", "replay_now", [replayed.id])
    page = text(response)
    assert "Replayed 1 parked task." in page
    assert response.redirect_chain[-1][0] == STORE_URL + "?breaker=payments"  # filters kept
    [message] = published(redis_client, queue)
    assert (message["id"], message["task"]) == (replayed.task_id, TASK)
    assert (message["args"], message["kwargs"]) == ([2], {"note": "note-2"})
    assert message["resilience_replays"] == 1
    assert resilience.backout.get(replayed.id) is None
    assert resilience.backout.get(kept.id) == kept


def test_replay_from_the_detail_page(
    resilience: Resilience, admin_client: Any, redis_client: redis.Redis, queue: str
) -> None:
    e = park(resilience, 3)
    response = act(admin_client, STORE_URL, "replay_now", e.id)
    assert "Replayed 1 parked task." in text(response)
    assert [m["id"] for m in published(redis_client, queue)] == [e.task_id]


def test_replay_reports_what_it_could_not_replay_and_sends_unknown_tasks_by_name(
    resilience: Resilience, admin_client: Any, redis_client: redis.Redis, queue: str
) -> None:
    # A task the web process does not have is published by name, as send_task does: the worker
    # that has it runs it. Only an entry that is no longer there can't be replayed.
    elsewhere = park(resilience, 1, task_name="shop.only_on_the_workers")
    ok = park(resilience, 2)
    fields = {"action": "replay_now", "_selected_action": [elsewhere.id, ok.id, "f" * 32]}
    asked = text(admin_client.post(STORE_URL, fields))
    assert "1 of the chosen entries is no longer in the store" in asked.replace("\n", " ")
    resilience.backout.delete(ok.id)  # gone between the question and the answer
    response = admin_client.post(STORE_URL, {**fields, "post": "yes"}, follow=True)
    page = text(response)
    assert "Replayed 1 parked task." in page
    assert "2 of the chosen entries were no longer in the store." in page
    assert resilience.backout.get(elsewhere.id) is None
    sent = {m["id"]: m["task"] for m in published(redis_client, queue)}
    assert sent == {elsewhere.task_id: "shop.only_on_the_workers"}


def test_discard_deletes_with_a_message(
    resilience: Resilience, admin_client: Any, redis_client: redis.Redis, queue: str
) -> None:
    a, b, c = (park(resilience, n) for n in range(3))
    response = act(admin_client, STORE_URL, "discard", [a.id, b.id])
    assert "Discarded 2 parked tasks." in text(response)
    assert resilience.backout.count() == 1
    assert resilience.backout.get(c.id) == c
    assert published(redis_client, queue) == []
    again = act(admin_client, STORE_URL, "discard", [a.id])
    assert "None of these entries is in the store now." in text(again)


def test_an_action_without_selection_says_so(resilience: Resilience, admin_client: Any) -> None:
    park(resilience, 1)
    response = admin_client.post(STORE_URL, {"action": "discard"}, follow=True)
    assert "none were chosen" in text(response)
    assert resilience.backout.count() == 1


def test_staff_without_delete_permission_can_look_but_not_act(
    resilience: Resilience, django_db: None
) -> None:
    from django.contrib.auth.models import Permission, User
    from django.test import Client

    e = park(resilience, 1)
    user = User.objects.create_user("clerk", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_storeentry"))
    client = Client()
    client.force_login(user)
    page = text(client.get(STORE_URL))
    assert e.id in page
    assert "action-select" not in page
    assert 'id="entry-discard"' not in text(client.get(f"{STORE_URL}{e.id}/"))
    response = client.post(STORE_URL, {"action": "discard", "_selected_action": [e.id]})
    assert response.status_code == 403
    assert resilience.backout.get(e.id) == e


def test_an_unreachable_store_is_reported_on_the_page(
    resilience: Resilience, admin_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery_resilience.errors import StoreUnavailable

    def down(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("back-out store unreachable: connection refused")

    monkeypatch.setattr(type(resilience.runtime.backout_store), "list", down)
    page = text(admin_client.get(STORE_URL))
    assert 'id="store-error"' in page
    assert "connection refused" in page
    assert "No parked tasks" not in page  # unknown, not none
    assert 'id="total"' not in page


# -- the database table's page --------------------------------------------------------------


def test_record_list_filters_and_search(db_resilience: Resilience, admin_client: Any) -> None:
    pay = park(db_resilience, 1, breaker="payments")
    mail = park(db_resilience, 2, breaker="mail", task_id="mail-42")

    def listed(query: dict[str, str]) -> set[str]:
        page = text(admin_client.get(RECORD_URL, query))
        return {e.id for e in (pay, mail) if e.id in page}

    assert listed({}) == {pay.id, mail.id}
    assert listed({"breaker": "mail"}) == {mail.id}
    assert listed({"reason": "breaker_open"}) == {pay.id, mail.id}
    assert listed({"q": "mail-42"}) == {mail.id}
    assert listed({"q": pay.id}) == {pay.id}
    assert f"{RECORD_URL}add/" not in text(admin_client.get(RECORD_URL))


def test_record_list_of_a_large_table_counts_no_row(
    db_resilience: Resilience, admin_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from celery_resilience.contrib.django import estimates

    pay = park(db_resilience, 1, breaker="payments")
    mail = park(db_resilience, 2, breaker="mail")
    # What PostgreSQL says of a table of a million rows (any database: the count is the point).
    monkeypatch.setattr(estimates, "estimated_count", lambda queryset: 1_000_000)
    for query in ({}, {"breaker__exact": "mail"}, {"status__exact": "parked"}):
        with CaptureQueriesContext(connection) as queries:
            page = text(admin_client.get(RECORD_URL, query))
        assert not [q for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]
        assert "1000000 parked task records" in page
        assert "about</span>" in page
        assert mail.id in page
        assert (pay.id in page) is ("breaker__exact" not in query)
    monkeypatch.setattr(estimates, "estimated_count", lambda queryset: 2)  # small: counted
    page = text(admin_client.get(RECORD_URL))
    assert "2 parked task records" in page
    assert "about</span>" not in page


def test_record_detail_decodes_the_payload(db_resilience: Resilience, admin_client: Any) -> None:
    e = park(db_resilience, 5, kwargs={"note": "fragile"})
    page = text(admin_client.get(f"{RECORD_URL}{e.id}/change/"))
    assert "&quot;note&quot;: &quot;fragile&quot;" in page
    assert "frame-5" in page
    assert "Claimed until" in page


def test_record_actions_replay_and_discard(
    db_resilience: Resilience, admin_client: Any, redis_client: redis.Redis, queue: str
) -> None:
    replayed, discarded = park(db_resilience, 1), park(db_resilience, 2)
    response = act(admin_client, RECORD_URL, "replay_now", [replayed.id])
    assert "Replayed 1 parked task." in text(response)
    assert [m["id"] for m in published(redis_client, queue)] == [replayed.task_id]
    response = act(admin_client, RECORD_URL, "discard", [discarded.id])
    assert "Discarded 1 parked task." in text(response)
    assert db_resilience.backout.count() == 0


def test_record_page_says_when_the_app_uses_another_store(
    make_admin_app: Callable[[str], Resilience], admin_client: Any
) -> None:
    redis_app = make_admin_app("redis")
    e = park(redis_app, 1)
    page = text(admin_client.get(RECORD_URL))
    assert "not in this table" in page
    assert e.id not in page
    assert e.id in text(admin_client.get(STORE_URL))


# -- how a list row reads ----------------------------------------------------------------------


def test_list_rows_show_short_ids_and_relative_times_with_the_whole_on_hover(
    resilience: Resilience, admin_client: Any
) -> None:
    """A row stays one line on a laptop: ids cut to 8 characters, "3 minutes ago"; the whole
    id and the exact time are the cells' hover titles."""
    from celery_resilience.contrib.django.display import when

    e = park(resilience, 1, parked_at=time.time() - 190, task_id=str(uuid.uuid4()))
    in_database = resilience.runtime.app.conf.resilience_backout_store == "django"
    page = text(admin_client.get(RECORD_URL if in_database else STORE_URL))
    if in_database:  # Django's own list: the entry id is its first column
        assert f'title="{e.id}">{e.id[:8]}…<' in page
        assert f'title="{e.task_id}">{e.task_id[:8]}…<' in page
    else:  # the task id (what Flower and the logs show) opens the entry
        link = f'href="{STORE_URL}{e.id}/" title="{e.task_id}" data-entry-id="{e.id}"'
        assert f"{link}>{e.task_id[:8]}…<" in page
    assert f'title="{when(e.parked_at)}">3\xa0minutes ago</time>' in page
    assert ">now<" in page  # due now: a drain replays it once its breaker admits calls
    assert "breaker_open" in page or "breaker open" in page


def test_the_stores_list_costs_the_same_round_trips_for_40_entries_or_400(
    make_admin_app: Callable[..., Resilience], admin_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page of the Redis store's list reads its rows in a few round trips, none a row, and
    counts the filter's entries without reading them."""
    lasting_knowledge(monkeypatch)  # no refresh of the breakers' views falls due in one only
    res = make_admin_app("redis")
    sent = {"commands": 0}
    original: Callable[..., Any] = redis.connection.AbstractConnection.send_packed_command
    page_thread = threading.get_ident()  # the test client serves the page in this thread

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == page_thread:  # not the breakers' watch, say, meanwhile
            sent["commands"] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counting)
    costs = []
    for total in (40, 400):
        for n in range(total - sum(1 for _ in res.backout.list(limit=1000))):
            park(res, n)
        text(admin_client.get(STORE_URL))  # warm: connections made, scripts loaded
        before = sent["commands"]
        page = text(admin_client.get(STORE_URL))
        costs.append(sent["commands"] - before)
        assert f'<span id="total">{total} entries</span>' in page, total
    # A round trip that falls due with time (a health check PING) may come in either; one a row
    # would add 360.
    assert abs(costs[1] - costs[0]) <= 3, costs


# -- the breakers' page ---------------------------------------------------------------------


@pytest.fixture
def observer(redis_url: str, key_prefix: str) -> Iterator[Resilience]:
    """Another app on the same Redis and prefix: it sees what every worker would see."""
    app = Celery("admin-observer", broker=redis_url, set_as_current=False)
    app.conf.resilience_redis_url = redis_url
    app.conf.resilience_key_prefix = key_prefix
    app.conf.resilience_breakers = BREAKERS
    resilience = Resilience(app)
    yield resilience
    resilience.runtime.close()
    app.close()


def test_breakers_page_shows_state_counts_and_open_until(
    make_admin_app: Callable[..., Resilience], admin_client: Any
) -> None:
    from celery_resilience.contrib.django.display import when

    res = make_admin_app("redis")
    payments = res.breaker("payments")
    for _ in range(3):  # failure_threshold 3: a real trip, "open until" is set
        payments.acquire().failure()
    assert payments.state == "open"
    open_until = payments.snapshot()["open_until"]
    res.breaker("search").acquire()  # a call in flight, under the bulkhead
    res.breaker("search").force_open()
    park(res, 1, breaker="legacy")  # not configured: known by its parked task
    legacy = res.breaker("legacy")
    legacy.acquire().success()
    legacy.acquire().failure()

    page = text(admin_client.get(BREAKERS_URL))
    assert "3 breakers" in page
    pay = row_of(page, "payments")
    assert (pay["name"], pay["state"], pay["opened_total"]) == ("payments", "open", "1")
    assert (pay["consecutive_failures"], pay["window"]) == ("0", "0/0 failed")  # new on opening
    assert re.fullmatch(r"in (29|30)\xa0seconds", pay["open_until"]), pay["open_until"]
    assert f'title="{when(open_until)}">in ' in page  # the exact time on hover
    assert re.fullmatch(r"\d+\xa0seconds? ago", pay["opened_at"]), pay["opened_at"]
    assert row_of(page, "search")["state"] == "forced_open"
    assert row_of(page, "search")["open_until"] == "until closed"  # forced, no window
    assert (row_of(page, "search")["in_flight"], pay["in_flight"]) == ("1/4", "—")
    # No "Force open" on a breaker forced open already; every lever elsewhere.
    assert f'href="{BREAKERS_URL}search/open/"' not in page
    assert f'href="{BREAKERS_URL}search/reset/"' in page
    old = row_of(page, "legacy")
    assert (old["state"], old["consecutive_failures"], old["window"]) == (
        "closed",
        "1",
        "1/2 failed",
    )
    assert f'href="{STORE_URL}?breaker=legacy"' in page  # its parked tasks
    assert old["parked"] == "1"
    assert old["last_error"] == "ConnectionError: gateway refused 1"
    assert pay["parked"] == "0"
    for action in ("open", "close", "reset"):
        assert f'href="{BREAKERS_URL}payments/{action}/"' in page


def test_breakers_page_shows_what_a_retry_budget_and_a_rate_limit_refused(
    make_admin_app: Callable[..., Resilience], admin_client: Any
) -> None:
    # given: a breaker with a retry budget that refused retries, one with a rate limit that
    # turned calls away, and one with neither
    res = make_admin_app(
        "redis",
        breakers={
            "gateway": {"retry_budget": 0.2, "min_retries_per_second": 1},
            "hook": {"rate_limit": "1/m"},
            "plain": {},
        },
    )
    gateway = res.breaker("gateway")
    for _ in range(10):
        gateway.acquire().success()
    # 20 % of 10 calls, plus the floor of 1/s over the window: well under 100
    granted = gateway.spend_retries(100)
    assert 0 < granted < 100
    hook = res.breaker("hook")
    hook.call(lambda: None)
    for _ in range(3):
        with pytest.raises(RateLimited):
            hook.call(lambda: None)
    res.runtime.flush()  # the turned-away count reaches Redis at a lease or a flush
    res.breaker("plain").acquire().success()
    # when: the page is read
    page = text(admin_client.get(BREAKERS_URL))
    # then: each limit says what it did; a breaker without one shows none
    assert "Limits</th>" in page
    assert row_of(page, "gateway")["limits"] == (
        f"retry budget 20% + 1/s: {granted} retries in the window, {100 - granted} refused"
    )
    assert row_of(page, "hook")["limits"] == "rate limit 1/m: 3 calls turned away"
    assert row_of(page, "plain")["limits"] == "—"


def test_breakers_page_has_no_limits_column_without_a_limit(
    make_admin_app: Callable[..., Resilience], admin_client: Any
) -> None:
    make_admin_app("redis").breaker("payments").acquire().success()
    page = text(admin_client.get(BREAKERS_URL))
    assert "payments" in page
    assert "Limits</th>" not in page
    assert "field-limits" not in page


def test_a_breaker_whose_name_has_a_slash_can_be_steered(
    make_admin_app: Callable[..., Resilience], admin_client: Any, observer: Resilience
) -> None:
    res = make_admin_app("redis")
    park(res, 1, breaker="eu/mail")
    page = text(admin_client.get(BREAKERS_URL))
    assert row_of(page, "eu/mail")["state"] == "closed"
    assert f'href="{BREAKERS_URL}eu/mail/open/"' in page
    admin_client.post(f"{BREAKERS_URL}eu/mail/open/")
    assert observer.breaker("eu/mail").state == "forced_open"


def test_force_open_closed_and_reset_ask_first_and_log_who(
    make_admin_app: Callable[..., Resilience],
    admin_client: Any,
    observer: Resilience,
    caplog: pytest.LogCaptureFixture,
) -> None:
    make_admin_app("redis")
    shared = observer.breaker("payments")
    caplog.set_level(logging.INFO, logger="celery_resilience.admin")

    confirm = text(admin_client.get(f"{BREAKERS_URL}payments/open/"))
    assert "Force open breaker “payments”?" in confirm
    assert 'id="confirm-steer"' in confirm
    assert shared.state == "closed"  # asking changes nothing

    steps = [("open", "forced open", "forced_open"), ("close", "forced closed", "forced_closed")]
    steps.append(("reset", "reset", "closed"))
    before = "closed"
    for action, done, state in steps:
        reason = "gateway maintenance" if action == "open" else ""
        response = admin_client.post(
            f"{BREAKERS_URL}payments/{action}/", {"reason": reason}, follow=True
        )
        assert response.redirect_chain[-1][0] == BREAKERS_URL
        page = text(response)
        assert f"Breaker “payments” {done}: now {state} (was {before})." in page
        assert row_of(page, "payments")["state"] == state
        assert shared.state == state  # in Redis, for every worker
        before = state
    logged = [r.getMessage() for r in caplog.records if r.name == "celery_resilience.admin"]
    assert logged == [
        "Breaker 'payments' forced open from the admin by boss (was closed, now forced_open;"
        " reason: gateway maintenance)",
        "Breaker 'payments' forced closed from the admin by boss"
        " (was forced_open, now forced_closed; reason: none given)",
        "Breaker 'payments' reset from the admin by boss (was forced_closed, now closed;"
        " reason: none given)",
    ]
    # And in Django's "Recent actions", newest first, with the user and the reason.
    from django.contrib.admin.models import LogEntry

    recorded = [
        (e.user.username, e.object_id, e.change_message)
        for e in LogEntry.objects.order_by("-action_time", "-pk")
    ]
    assert recorded == [
        ("boss", "payments", "Reset (was forced_closed) from the admin."),
        ("boss", "payments", "Forced closed (was forced_open) from the admin."),
        (
            "boss",
            "payments",
            "Forced open (was closed) from the admin. Reason: gateway maintenance",
        ),
    ]
    assert "payments" in text(admin_client.get("/admin/"))  # the index's Recent actions


def test_reset_closes_a_tripped_breaker(
    make_admin_app: Callable[..., Resilience], admin_client: Any, observer: Resilience
) -> None:
    res = make_admin_app("redis")
    for _ in range(3):
        res.breaker("payments").acquire().failure()
    assert observer.breaker("payments").state == "open"
    admin_client.post(f"{BREAKERS_URL}payments/reset/")
    snap = observer.breaker("payments").snapshot()
    assert (snap["state"], snap["consecutive_failures"], snap["opened_total"]) == ("closed", 0, 1)


def test_unknown_breaker_or_action_changes_nothing(
    make_admin_app: Callable[..., Resilience], admin_client: Any
) -> None:
    res = make_admin_app("redis")
    page = text(admin_client.post(f"{BREAKERS_URL}nope/open/", follow=True))
    assert "Unknown breaker &#x27;nope&#x27;." in page
    assert "nope" not in res.runtime.breaker_names()  # a typo made no breaker
    page = text(admin_client.post(f"{BREAKERS_URL}payments/explode/", follow=True))
    assert "Unknown action &#x27;explode&#x27;." in page
    assert res.breaker("payments").state == "closed"


def test_breakers_need_view_to_look_and_change_to_steer(
    make_admin_app: Callable[..., Resilience], django_db: None, observer: Resilience
) -> None:
    from django.contrib.auth.models import Permission, User
    from django.test import Client

    make_admin_app("redis")

    def client_of(name: str, *codenames: str, staff: bool = True) -> Client:
        user = User.objects.create_user(name, password="pw", is_staff=staff)
        for codename in codenames:
            user.user_permissions.add(Permission.objects.get(codename=codename))
        client = Client()
        client.force_login(user)
        return client

    viewer = client_of("viewer", "view_breaker")
    page = text(viewer.get(BREAKERS_URL))
    assert row_of(page, "payments")["state"] == "closed"
    assert 'class="lever"' not in page
    assert viewer.get(f"{BREAKERS_URL}payments/open/").status_code == 403
    assert viewer.post(f"{BREAKERS_URL}payments/open/").status_code == 403
    assert observer.breaker("payments").state == "closed"

    nobody = client_of("nobody", staff=False)
    assert nobody.get(BREAKERS_URL).status_code == 302  # to the login page
    assert nobody.post(f"{BREAKERS_URL}payments/open/").status_code == 302
    assert observer.breaker("payments").state == "closed"

    operator = client_of("operator", "change_breaker")
    assert 'class="lever"' in text(operator.get(BREAKERS_URL))
    response = operator.post(f"{BREAKERS_URL}payments/open/")
    assert response.status_code == 302
    assert observer.breaker("payments").state == "forced_open"


def test_an_unreachable_redis_is_reported_on_the_breakers_page(
    make_admin_app: Callable[..., Resilience], admin_client: Any
) -> None:
    from tests.support.redis_server import free_port

    make_admin_app("redis", redis_at=f"redis://:s3cret@127.0.0.1:{free_port()}/0")
    started = time.monotonic()
    page = text(admin_client.get(BREAKERS_URL))
    assert time.monotonic() - started < 5
    assert 'id="breakers-error"' in page
    assert "s3cret" not in page
    response = admin_client.post(f"{BREAKERS_URL}payments/open/", follow=True)
    assert "s3cret" not in text(response)
    assert 'class="error"' in text(response)


#: A password with "@" and ":" in it: a URL's credentials end at its last "@".
AT_SECRET = "s3c@r3t:pw-t41l"


def shows_at_secret(text: str) -> bool:
    return any(piece in text for piece in ("s3c", "r3t", "pw-t41l"))


@pytest.mark.parametrize("which", ["ParkedTaskRecordAdmin", "BreakerAdmin", "StoreEntryAdmin"])
def test_every_admin_message_is_redacted(which: str, django_db: None) -> None:
    """Given an error whose text quotes a URL with a password; when any admin page reports it
    with ``message_user``, then the message shows the URL masked."""
    from django.contrib import admin, messages
    from django.contrib.messages.storage.cookie import CookieStorage
    from django.test import RequestFactory

    from celery_resilience.contrib.django import admin as admin_module

    model_admin = next(a for a in admin.site._registry.values() if type(a).__name__ == which)
    assert isinstance(model_admin, getattr(admin_module, which))
    request = RequestFactory().get("/")
    request._messages = CookieStorage(request)
    url = f"redis://app:{AT_SECRET}@127.0.0.1:6379/0"
    model_admin.message_user(request, f"ConnectionError: no answer from {url}", messages.ERROR)
    shown = [str(m) for m in request._messages]
    assert shown == ["ConnectionError: no answer from redis://app:***@127.0.0.1:6379/0"]


def test_a_misconfigured_app_is_reported_without_its_password(
    admin_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given an app whose resilience_redis_url is invalid and holds a password with "@" and
    ":"; when the parked tasks' page reports that the app is unusable, then no piece of the
    password shows."""
    from django.test import override_settings

    bad = Celery("admin-bad", broker="memory://", set_as_current=False)
    bad.conf.resilience_redis_url = f"redis://:{AT_SECRET}@127.0.0.1:notaport/0"
    monkeypatch.setattr(admin_world, "APP", bad)
    with override_settings(CELERY_RESILIENCE_APP=f"{admin_world.__name__}:APP"):
        page = text(admin_client.get(RECORD_URL))
    assert "No usable Celery app" in page
    assert "redis://:***@127.0.0.1:notaport/0" in page
    assert not shows_at_secret(page)


# -- which Celery app ------------------------------------------------------------------------


def test_without_the_setting_the_current_app_is_used(django_db: None) -> None:
    from celery import _state
    from django.test import override_settings

    from celery_resilience.contrib.django.conf import celery_app

    app = Celery("current-test", set_as_current=False)
    previous = _state.get_current_app()
    app.set_current()
    try:
        with override_settings(CELERY_RESILIENCE_APP=None):
            assert celery_app() is app
    finally:
        previous.set_current()
        app.close()


def test_a_bad_app_setting_names_the_setting(django_db: None) -> None:
    from django.core.exceptions import ImproperlyConfigured
    from django.test import override_settings

    from celery_resilience.contrib.django.conf import celery_app

    with (
        override_settings(CELERY_RESILIENCE_APP="tests.no_such_module:app"),
        pytest.raises(ImproperlyConfigured, match="CELERY_RESILIENCE_APP"),
    ):
        celery_app()
