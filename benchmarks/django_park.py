"""The Django database store under a park storm, and its admin list at a million rows.

    python benchmarks/django_park.py [--seconds S] [--rounds R] [--prefill N] [--rows N]

On PostgreSQL (``127.0.0.1:5432``, user ``postgres``, trust auth; ``--pg-host`` etc.), in a
database of this run's own (``resilience_bench_<pid>``, made with Django's migrations and
dropped at the end):

1. parks/s with 1, 4 and 16 processes parking at once (``fork``, each with its own connection,
   each parking entries of ~1 KB for S seconds), on a table already holding N rows (default
   100,000: a storm under way), through two paths in the same run:

   - ``serialized``: the park as it was, kept here: one lock row (``lock|park``) written
     first, so parks wait for each other, then ``exists``, ``COUNT(*)`` of the table (the
     full-store check), the insert and its counter row;
   - ``store``: ``DjangoBackoutStore.park`` as it is now.

   The paths alternate, R rounds (default 2); the table shows each one's best round and the
   spread (slowest / best), and the ratio store / serialized. Rows parked are deleted (and the
   table vacuumed) after each measurement, so every one starts from the same table.
2. the admin's list of the table (``ParkedTaskRecordAdmin``) at ``--rows`` rows (default
   1,000,000; filled by ``INSERT ... SELECT generate_series``, then ``VACUUM ANALYZE``) through
   Django's test client, logged in as a superuser: the first page, page 100, and filtered by
   status, breaker and reason; milliseconds (best of 3) and whether a ``COUNT(*)`` ran, against
   Django's own paginator and full count (the admin as it was before) in the same run.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from celery_resilience import ParkedTask

DB = f"resilience_bench_{os.getpid()}"
PROCESSES = (1, 4, 16)
MARK = "bench.storm"  # task_name of the rows the storm parks (deleted after each measure)


def configure(opts: argparse.Namespace) -> None:
    import django
    from django.conf import settings

    settings.configure(
        SECRET_KEY="bench",
        DEBUG=False,
        ALLOWED_HOSTS=["testserver"],
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        INSTALLED_APPS=[
            "django.contrib.admin",
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "django.contrib.messages",
            "celery_resilience.contrib.django",
        ],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "django.contrib.messages.middleware.MessageMiddleware",
        ],
        TEMPLATES=[
            {
                "BACKEND": "django.template.backends.django.DjangoTemplates",
                "APP_DIRS": True,
                "OPTIONS": {
                    "context_processors": [
                        "django.template.context_processors.request",
                        "django.contrib.auth.context_processors.auth",
                        "django.contrib.messages.context_processors.messages",
                    ]
                },
            }
        ],
        ROOT_URLCONF=__name__,
        PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "HOST": opts.pg_host,
                "PORT": opts.pg_port,
                "USER": opts.pg_user,
                "NAME": DB,
            }
        },
    )
    django.setup()


def __getattr__(name: str) -> Any:
    if name == "urlpatterns":
        from django.contrib import admin
        from django.urls import path

        return [path("admin/", admin.site.urls)]
    raise AttributeError(name)


def entry(n: int) -> ParkedTask:
    return ParkedTask.new(
        task_name=MARK,
        task_id=str(uuid.uuid4()),
        args=[f"A-{n}"],
        kwargs={"amount": 1999, "currency": "EUR", "customer": n % 5000},
        options={"queue": "payments"},
        breaker="payments",
        reason="breaker_open",
        exc_type="builtins.ConnectionError",
        exc_message="gateway refused the connection",
        traceback="Traceback (most recent call last):\n" + '  File "shop.py", line 1\n' * 20,
        retries=3,
    )


def serialized_park(store: Any, e: ParkedTask) -> None:
    """The park as it was: a lock row, then exists, COUNT(*), insert, counter."""
    from django.db import transaction

    from celery_resilience.backout.store import Meta
    from celery_resilience.contrib.django.store import reachable
    from celery_resilience.errors import StoreFull

    data = store.codec.encode(e)
    meta = Meta.of(e)
    with reachable(), transaction.atomic(using=store.using):
        store._stats.lock("park")
        rows = store._rows()
        if rows.filter(pk=e.id).exists():
            return
        if rows.count() >= store.max_entries:
            raise StoreFull(store.max_entries, e.id)
        store._insert(e, meta, data)
        store._stats.add(f"parked|{meta.breaker}|{meta.reason}", 1)


def parker(path: str, seconds: float, start: Any, results: Any) -> None:
    from django.db import connections

    from celery_resilience.contrib.django.store import DjangoBackoutStore

    connections.close_all()  # never the parent's socket
    store = DjangoBackoutStore()
    park = store.park if path == "store" else lambda e: serialized_park(store, e)
    entries = [entry(n) for n in range(20_000)]
    start.wait()
    done, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        park(entries[done])
        done += 1
    results.put(done)


def storm(path: str, processes: int, seconds: float) -> float:
    from django.db import connections

    connections.close_all()
    ctx = multiprocessing.get_context("fork")
    start, results = ctx.Event(), ctx.Queue()
    workers = [
        ctx.Process(target=parker, args=(path, seconds, start, results)) for _ in range(processes)
    ]
    for w in workers:
        w.start()
    time.sleep(1.0 + 0.1 * processes)  # every child connected and ready
    start.set()
    total = sum(results.get(timeout=seconds + 60) for _ in workers)
    for w in workers:
        w.join()
    clean()
    return total / seconds


def clean() -> None:
    from django.db import connection

    from celery_resilience.contrib.django.models import ParkedTaskRecord

    ParkedTaskRecord.objects.filter(task_name=MARK).delete()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE celery_resilience_parkedtaskrecord")


def fill(rows: int) -> None:
    """Rows up to ``rows``, made inside PostgreSQL (70 % payments, 29 % search, 1 % none;
    5 % retries_exhausted; 0.1 % dead), with one real entry's bytes as every payload."""
    from django.db import connection

    from celery_resilience.backout.codec import Codec

    payload = Codec("json").encode(entry(0))
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM celery_resilience_parkedtaskrecord")
        have = cursor.fetchone()[0]
        cursor.execute(
            """
            INSERT INTO celery_resilience_parkedtaskrecord
              (id, task_name, task_id, breaker, reason, status, dead_reason,
               parked_at, due_at, payload)
            SELECT md5(n::text || %s), 'shop.charge', md5(n::text),
              CASE WHEN n %% 1000 < 700 THEN 'payments' WHEN n %% 1000 < 990 THEN 'search'
                   ELSE '-' END,
              CASE WHEN n %% 20 = 0 THEN 'retries_exhausted' ELSE 'breaker_open' END,
              CASE WHEN n %% 1000 = 500 THEN 'dead' ELSE 'parked' END,
              CASE WHEN n %% 1000 = 500 THEN 'unpublishable' ELSE '' END,
              1700000000 + n / 300.0, 1700000030 + n / 300.0, %s
            FROM generate_series(%s, %s) AS n
            """,
            [DB, payload, have, rows - 1],
        )
        cursor.execute("VACUUM ANALYZE celery_resilience_parkedtaskrecord")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prefill", type=int, default=100_000)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--pg-host", default="127.0.0.1")
    parser.add_argument("--pg-port", type=int, default=5432)
    parser.add_argument("--pg-user", default="postgres")
    opts = parser.parse_args()
    server = {"host": opts.pg_host, "port": opts.pg_port, "user": opts.pg_user}
    with psycopg.connect(dbname="postgres", autocommit=True, **server) as admin:
        admin.execute(f'CREATE DATABASE "{DB}"')
    try:
        configure(opts)
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        if opts.seconds > 0:
            parks(opts)
        if opts.rows > 0:
            changelist(opts.rows)
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(dbname="postgres", autocommit=True, **server) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')


def parks(opts: argparse.Namespace) -> None:
    fill(opts.prefill)
    print(
        f"parks/s on a table of {opts.prefill:,} rows, {opts.seconds:g} s each, best of "
        f"{opts.rounds} (spread slowest/best):"
    )
    print(f"  {'processes':>9}  {'serialized':>16}  {'store':>16}  {'ratio':>6}")
    for processes in PROCESSES:
        figures: dict[str, list[float]] = {"serialized": [], "store": []}
        for r in range(opts.rounds):
            order = ("serialized", "store") if r % 2 == 0 else ("store", "serialized")
            for path in order:
                figures[path].append(storm(path, processes, opts.seconds))
        old, new = max(figures["serialized"]), max(figures["store"])
        cells = [
            f"{max(v):8,.0f} x{max(v) / min(v):.2f}".rjust(16)
            for v in (figures["serialized"], figures["store"])
        ]
        print(f"  {processes:>9}  {cells[0]}  {cells[1]}  {new / old:6.2f}")


def changelist(rows: int) -> None:
    from django.contrib import admin
    from django.contrib.auth.models import User
    from django.core.paginator import Paginator
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext, setup_test_environment

    from celery_resilience.contrib.django.models import ParkedTaskRecord

    setup_test_environment()
    started = time.perf_counter()
    fill(rows)
    print(
        f"\nadmin list at {rows:,} rows (filled in {time.perf_counter() - started:.0f}s), "
        "ms best of 3 (COUNT(*) queries):"
    )
    client = Client()
    client.force_login(User.objects.create_superuser("boss", "b@example.com", "pw"))
    model_admin = admin.site._registry[ParkedTaskRecord]
    now = (model_admin.paginator, model_admin.show_full_result_count)
    variants = {"before (Django's count)": (Paginator, True), "now": now}
    url = "/admin/celery_resilience/parkedtaskrecord/"
    pages = [
        "",
        "?p=100",
        "?status__exact=dead",
        "?breaker__exact=search",
        "?reason__exact=retries_exhausted",
    ]
    print(f"  {'page':36}" + "".join(f"{name:>24}" for name in variants))
    for query in pages:
        cells = []
        for paginator, full in variants.values():
            model_admin.paginator, model_admin.show_full_result_count = paginator, full
            times, counts = [], 0
            for _ in range(3):
                with CaptureQueriesContext(connection) as queries:
                    begun = time.perf_counter()
                    response = client.get(url + query)
                    times.append(time.perf_counter() - begun)
                assert response.status_code == 200, response.status_code
                counts = sum("COUNT(*)" in q["sql"].upper() for q in queries.captured_queries)
            cells.append(f"{min(times) * 1000:9.0f} ms ({counts})".rjust(24))
        print(f"  {query or '(first page)':36}" + "".join(cells))
    model_admin.paginator, model_admin.show_full_result_count = now


if __name__ == "__main__":
    main()
