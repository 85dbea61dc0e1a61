"""The migrations of ``celery_resilience.contrib.django`` match its models."""

from __future__ import annotations

import io

import pytest

from tests.support import django_settings

pytestmark = pytest.mark.integration


def test_models_need_no_new_migration(request: pytest.FixtureRequest) -> None:
    # makemigrations checks the migration history of ``default``: let it be our test database.
    django_settings.ensure_test_database("default", request.config)
    from django.core.management import call_command

    out = io.StringIO()
    try:
        call_command(
            "makemigrations", "celery_resilience", "--check", "--dry-run", stdout=out, stderr=out
        )
    except SystemExit as exit_:  # --check exits non-zero when a migration is missing
        pytest.fail(f"models and migrations differ (exit {exit_.code}):\n{out.getvalue()}")
    assert "No changes detected" in out.getvalue()


def test_migrations_made_the_tables(request: pytest.FixtureRequest) -> None:
    django_settings.ensure_test_database("default", request.config)
    from django.db import connections

    tables = set(connections["default"].introspection.table_names())
    assert {"celery_resilience_parkedtaskrecord", "celery_resilience_resiliencestat"} <= tables
    assert "celery_resilience_storeentry" not in tables  # unmanaged: the admin page's anchor


@pytest.mark.parametrize("alias", ["sqlite", "postgresql"])
def test_the_filter_indexes_migrate_back_and_forth(
    alias: str, request: pytest.FixtureRequest
) -> None:
    django_settings.ensure_test_database(alias, request.config)
    from django.core.management import call_command
    from django.db import connections

    def indexes() -> set[str]:
        connection = connections[alias]
        with connection.cursor() as cursor:
            found = connection.introspection.get_constraints(
                cursor, "celery_resilience_parkedtaskrecord"
            )
        return {name for name in found if name.startswith("resilience_")}

    wanted = {"resilience_status_parked", "resilience_reason_parked", "resilience_held"}
    assert indexes() == wanted
    call_command("migrate", "celery_resilience", "0002", database=alias, verbosity=0)
    try:
        assert indexes() == set()
    finally:
        call_command("migrate", "celery_resilience", database=alias, verbosity=0)
    assert indexes() == wanted
