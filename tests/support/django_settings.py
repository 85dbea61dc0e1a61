"""Django settings of the ``celery_resilience.contrib.django`` tests, and the helpers using them.

Django is configured only when a Django test asks for it (:func:`setup` calls
``settings.configure`` with the upper-case names below), so the rest of the suite never sees
Django; the module also works as ``DJANGO_SETTINGS_MODULE=tests.support.django_settings``.

``RESILIENCE_TEST_DB`` picks the ``default`` database (the admin tests'): ``sqlite`` (the
default, a temporary file) or ``postgresql`` (127.0.0.1:5432, user postgres, trust auth). The
contract suite uses the ``sqlite`` and ``postgresql`` aliases whatever it says. Every test
database is made by Django's own creation code under a name unique to this run (a temp file, or
``test_resilience_<alias>_<random>``) and destroyed at the end; no other database is touched.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from celery_resilience.contrib.django.store import DjangoBackoutStore

_RUN = f"{os.getpid()}_{uuid.uuid4().hex[:10]}"
PG_HOST = os.environ.get("RESILIENCE_TEST_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("RESILIENCE_TEST_PG_PORT", "5432"))
PG_USER = os.environ.get("RESILIENCE_TEST_PG_USER", "postgres")
TEST_DB = os.environ.get("RESILIENCE_TEST_DB", "sqlite")
if TEST_DB not in ("sqlite", "postgresql"):
    raise ValueError(f"RESILIENCE_TEST_DB must be 'sqlite' or 'postgresql', got {TEST_DB!r}")


def _django_version() -> tuple[int, ...]:
    try:
        import django
    except ImportError:  # the Django tests skip; nothing here is used
        return (0,)
    return tuple(django.VERSION[:2])


_SQLITE_INIT = _django_version() >= (5, 1)


def _sqlite(alias: str) -> dict[str, Any]:
    folder = tempfile.gettempdir()
    return {
        "ENGINE": "django.db.backends.sqlite3",
        # Never opened: Django's creation code switches to the test file before connecting.
        "NAME": os.path.join(folder, f"resilience_{alias}_{_RUN}.sqlite3"),
        "TEST": {"NAME": os.path.join(folder, f"test_resilience_{alias}_{_RUN}.sqlite3")},
        # Throw-away databases: skip the fsyncs (durability only; locking is unchanged). The
        # SQLite backend takes init_command from Django 5.1 on.
        "OPTIONS": {"init_command": "PRAGMA synchronous=OFF"} if _SQLITE_INIT else {},
    }


def _postgresql(alias: str) -> dict[str, Any]:
    return {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": PG_HOST,
        "PORT": PG_PORT,
        "USER": PG_USER,
        "NAME": "test",
        "TEST": {"NAME": f"test_resilience_{alias}_{_RUN}"},
        "OPTIONS": {"options": "-c synchronous_commit=off"},  # as above, for speed
    }


SECRET_KEY = "celery-resilience-tests-only"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "127.0.0.1", "localhost"]
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",  # the admin's CSS when a browser test runs the server
    "django_celery_results",
    "celery_resilience.contrib.django",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
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
]
ROOT_URLCONF = "tests.support.django_settings"
STATIC_URL = "/static/"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins
DATABASES = {
    "default": _postgresql("default") if TEST_DB == "postgresql" else _sqlite("default"),
    "sqlite": _sqlite("contract"),
    "postgresql": _postgresql("contract"),
}


def __getattr__(name: str) -> Any:
    """``urlpatterns`` of ``ROOT_URLCONF``, made on first use (the admin needs apps loaded)."""
    if name == "urlpatterns":
        from django.contrib import admin
        from django.urls import path

        return [path("admin/", admin.site.urls)]
    raise AttributeError(name)


# -- helpers ----------------------------------------------------------------------------------

_created: dict[str, str] = {}  # alias -> its original NAME, for destroy_test_db


def setup(config: pytest.Config) -> None:
    """Configure Django with these settings once per process (test environment included)."""
    import django
    from django.conf import settings
    from django.test.utils import setup_test_environment, teardown_test_environment

    if settings.configured:
        return
    settings.configure(**{name: value for name, value in globals().items() if name.isupper()})
    django.setup()
    setup_test_environment()
    config.add_cleanup(teardown_test_environment)


def postgresql_unreachable() -> str | None:
    """Why the PostgreSQL server can't be used, or ``None`` when it can."""
    import psycopg

    try:
        psycopg.connect(
            host=PG_HOST, port=PG_PORT, user=PG_USER, dbname="postgres", connect_timeout=3
        ).close()
    except psycopg.Error as exc:
        return f"PostgreSQL at {PG_HOST}:{PG_PORT} (user {PG_USER}) is unreachable: {exc}"
    return None


def ensure_test_database(alias: str, config: pytest.Config) -> None:
    """Create the test database of ``alias`` once per session; destroyed when pytest ends."""
    setup(config)
    if alias in _created:
        return
    from django.db import connections

    connection = connections[alias]
    if connection.vendor == "postgresql" and (why := postgresql_unreachable()):
        if os.environ.get("CI"):  # CI starts PostgreSQL: not having it there is a failure
            pytest.fail(why)
        pytest.skip(why)  # a contributor without PostgreSQL still runs the SQLite half
    original = connection.settings_dict["NAME"]
    # autoclobber=False: a test database of that (random) name already there is an error,
    # never something to drop.
    connection.creation.create_test_db(verbosity=0, autoclobber=False, serialize=False)
    _created[alias] = original
    config.add_cleanup(lambda: _destroy(alias))


def _destroy(alias: str) -> None:
    from django.db import connections

    connection = connections[alias]
    if connection.vendor == "postgresql":
        # Threads of the concurrency tests may have left connections to *our* test database.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                [connection.settings_dict["NAME"]],
            )
    connection.creation.destroy_test_db(_created.pop(alias), verbosity=0)


def clear(alias: str) -> None:
    """Empty the store's tables in our test database of ``alias``."""
    from celery_resilience.contrib.django.models import (
        ConsumedEntry,
        ParkedTaskRecord,
        ResilienceStat,
    )

    ParkedTaskRecord.objects.using(alias).all().delete()
    ResilienceStat.objects.using(alias).all().delete()
    ConsumedEntry.objects.using(alias).all().delete()


# -- the contract suite (tests/test_backout_store.py) ---------------------------------------


class _Payload:
    def __init__(self, data: bytes) -> None:
        self.data = data


class _Payloads:
    """``store._records.get(id).data`` as the contract suite's ``raw()`` reads the memory store."""

    def __init__(self, store: DjangoBackoutStore) -> None:
        self.store = store

    def get(self, entry_id: str) -> _Payload | None:
        rows = self.store._model.objects.using(self.store.using).filter(pk=entry_id)
        payload = rows.values_list("payload", flat=True).first()
        return None if payload is None else _Payload(bytes(payload))


class ContractStore(DjangoBackoutStore):
    """The database store with the raw-bytes view the contract suite's ``raw()`` uses."""

    @property
    def _records(self) -> _Payloads:
        return _Payloads(self)


def contract_store_factory(request: pytest.FixtureRequest) -> Callable[..., ContractStore]:
    """``make_store`` of the contract suite for params ``django`` and ``django-postgresql``."""
    alias = "postgresql" if request.param == "django-postgresql" else "sqlite"
    ensure_test_database(alias, request.config)
    clear(alias)
    request.addfinalizer(lambda: clear(alias))

    def make(**options: Any) -> ContractStore:
        return ContractStore(using=alias, **options)

    return make
