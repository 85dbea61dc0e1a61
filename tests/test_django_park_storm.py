"""The database store under a park storm: no lock row, an approximate full-store check whose
error is the documented one, and counts that PostgreSQL estimates instead of reading rows."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from celery_resilience import ParkedTask
from celery_resilience.backout import StoreFull
from celery_resilience.contrib.django import estimates, room
from celery_resilience.contrib.django.store import DjangoBackoutStore
from tests.support import django_settings

pytestmark = pytest.mark.integration


@pytest.fixture(params=["sqlite", "postgresql"])
def alias(request: pytest.FixtureRequest) -> Iterator[str]:
    name = str(request.param)
    django_settings.ensure_test_database(name, request.config)
    django_settings.clear(name)
    yield name
    django_settings.clear(name)


def entry(n: int, breaker: str = "b") -> ParkedTask:
    return ParkedTask.new(
        task_name="shop.charge", task_id=f"task-{n}", reason="breaker_open", breaker=breaker
    )


def rows(alias: str, count: int, **fields: Any) -> None:
    """``count`` rows of ~1 KB written straight into the table (no park), then ANALYZE."""
    from django.db import connections

    from celery_resilience.contrib.django.models import ParkedTaskRecord

    values = {"breaker": "b", "reason": "breaker_open", "status": "parked", **fields}
    ParkedTaskRecord.objects.using(alias).bulk_create(
        ParkedTaskRecord(
            id=uuid.uuid4().hex,
            task_name="shop.charge",
            task_id=str(n),
            parked_at=time.time(),
            due_at=time.time(),
            payload=b"x" * 1000,
            **values,
        )
        for n in range(count)
    )
    if connections[alias].vendor == "postgresql":
        with connections[alias].cursor() as cursor:
            cursor.execute("ANALYZE celery_resilience_parkedtaskrecord")


def counts(alias: str, fn: Any) -> int:
    """The ``COUNT(`` queries ``fn()`` sends to ``alias``."""
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connections[alias]) as queries:
        fn()
    return sum("COUNT(" in q["sql"].upper() for q in queries.captured_queries)


def test_parks_take_no_lock_row_and_spread_their_counter(alias: str) -> None:
    from celery_resilience.contrib.django.models import ResilienceStat

    store = DjangoBackoutStore(using=alias)
    for n in range(40):
        store.park(entry(n))
    store.park(entry(0).replace(id=store.list(limit=1)[0].id))  # a duplicate: a no-op
    assert store.count() == 40
    assert store.stats()["parked|b|breaker_open"] == 40
    names = set(ResilienceStat.objects.using(alias).values_list("name", flat=True))
    assert not [n for n in names if n.startswith("lock|")]
    assert len([n for n in names if n.endswith("parked|b|breaker_open")]) > 1


def test_far_below_the_limit_a_park_counts_nothing(
    alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    limit = 10 * estimates.EXACT_BELOW  # under a smaller limit every park near it counts
    monkeypatch.setattr(room, "estimated_rows", lambda model, using: 10)
    store = DjangoBackoutStore(using=alias, max_entries=limit)
    assert counts(alias, lambda: [store.park(entry(n)) for n in range(5)]) == 0  # type: ignore[func-returns-value]
    monkeypatch.setattr(room, "estimated_rows", lambda model, using: limit * 0.95)  # within 10 %
    assert counts(alias, lambda: [store.park(entry(n)) for n in range(5, 10)]) == 1  # type: ignore[func-returns-value]
    assert store.count() == 10


def test_under_a_small_limit_an_estimate_far_below_the_truth_lets_no_park_pass_it(
    alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(room, "estimated_rows", lambda model, using: 0)  # a stale density
    store = DjangoBackoutStore(using=alias, max_entries=40)
    for n in range(40):
        store.park(entry(n))
    with pytest.raises(StoreFull):
        store.park(entry(40))
    assert store.count() == 40


def test_near_the_limit_one_store_is_exact_and_another_passes_it_by_what_the_first_parked(
    alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(room, "COUNT_TTL", 60.0)  # no recount within the test, however slow
    first = DjangoBackoutStore(using=alias, max_entries=10)
    second = DjangoBackoutStore(using=alias, max_entries=10)  # another process
    for n in range(6):
        first.park(entry(n))  # counted 0, then its own 6
    for n in range(6, 10):
        second.park(entry(n))  # counted 6, then its own 4: full
    with pytest.raises(StoreFull):
        second.park(entry(10))
    for n in range(10, 14):
        first.park(entry(n))  # its count is 6 + its own: it admits 4 more
    with pytest.raises(StoreFull):
        first.park(entry(14))
    assert first.count() == 14  # the limit + what the other store parked since first counted
    assert first.delete(first.list(limit=1)[0].id)  # a store that removes counts again
    with pytest.raises(StoreFull):
        first.park(entry(15))  # 13 stored: still over the limit
    monkeypatch.setattr(room, "COUNT_TTL", 0.0)
    for e in second.list(limit=5):
        second.delete(e.id)
    first.park(entry(16))  # 8 stored: room again, and exact
    first.park(entry(17))
    with pytest.raises(StoreFull):
        first.park(entry(18))
    assert first.count() == 10


def test_postgresqls_estimate_follows_a_growing_table(request: pytest.FixtureRequest) -> None:
    from django.db import connections

    from celery_resilience.contrib.django.models import ParkedTaskRecord

    django_settings.ensure_test_database("postgresql", request.config)
    django_settings.clear("postgresql")
    # A table emptied by DELETE keeps its pages (dead rows) until a vacuum, which would thin
    # the rows per page ANALYZE sees: the estimate is held to a table that starts empty.
    with connections["postgresql"].cursor() as cursor:
        cursor.execute(f"TRUNCATE {ParkedTaskRecord._meta.db_table}")
    try:
        assert estimates.estimated_rows(ParkedTaskRecord, "postgresql") is None  # too small
        rows("postgresql", 3000)
        estimate = estimates.estimated_rows(ParkedTaskRecord, "postgresql")
        assert estimate is not None
        assert abs(estimate - 3000) < 300
        ParkedTaskRecord.objects.using("postgresql").bulk_create(
            ParkedTaskRecord(
                id=uuid.uuid4().hex,
                task_name="t",
                task_id="t",
                breaker="b",
                reason="breaker_open",
                status="parked",
                parked_at=0.0,
                due_at=0.0,
                payload=b"x" * 1000,
            )
            for _ in range(1000)
        )  # no ANALYZE: the estimate follows the table's pages
        estimate = estimates.estimated_rows(ParkedTaskRecord, "postgresql")
        assert estimate is not None
        assert abs(estimate - 4000) < 400
    finally:
        django_settings.clear("postgresql")


def test_the_paginator_estimates_large_results_and_counts_small_ones(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery_resilience.contrib.django.models import ParkedTaskRecord

    django_settings.ensure_test_database("postgresql", request.config)
    django_settings.clear("postgresql")
    monkeypatch.setattr(estimates, "EXACT_BELOW", 1000)
    try:
        rows("postgresql", 3000, breaker="pay")
        rows("postgresql", 40, breaker="mail", status="dead")
        table = ParkedTaskRecord.objects.using("postgresql").order_by("-parked_at")
        paginator = estimates.EstimatedPaginator(table, 100)
        assert counts("postgresql", lambda: paginator.count) == 0
        assert paginator.estimated
        assert abs(paginator.count - 3040) < 304
        assert len(paginator.page(1).object_list) == 100
        dead = estimates.EstimatedPaginator(table.filter(status="dead"), 100)
        assert dead.count == 40  # the estimate is small: counted, exact
        assert not dead.estimated
        names = estimates.distinct_values(ParkedTaskRecord, "postgresql", "breaker")
        assert names == ["mail", "pay"]
    finally:
        django_settings.clear("postgresql")
