"""``tests.apps.workerapp`` with the drain in its beat schedule: what ``celery beat`` and the worker
of the beat scheduler tests load.

The ``WORKERAPP_*`` variables are those of ``tests.apps.workerapp``; besides them:

=======================  ====================================================================
BEATAPP_DRAIN_EVERY      seconds between two drains (default 1)
BEATAPP_DRAIN_RATE       ``resilience_drain_rate`` (default 10 tasks/s: 40 entries take several
                         drain passes)
BEATAPP_DRAIN_BATCH      ``resilience_drain_batch`` (default 5)
BEATAPP_SCHEDULE         ``entry`` (default): the drain is in ``beat_schedule``; ``none``: it is
                         not (a ``PeriodicTask`` row made by ``periodic_task`` runs it)
BEATAPP_DJANGO_DB        a SQLite file: Django is set up with ``django_celery_beat`` on it, for
                         ``-S django_celery_beat.schedulers:DatabaseScheduler``
=======================  ====================================================================

RedBeat (``-S redbeat.RedBeatScheduler``) keeps its schedule and its lock in the test's Redis,
under ``<prefix>:redbeat:``, so the prefix's clean-up takes them too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from celery import Celery

from celery_resilience import Resilience
from tests.apps.workerapp import make_app as make_worker_app
from tests.apps.workerapp import settings as worker_settings

DRAIN_ENTRY = "celery-resilience-drain"


def setup_django(db_path: str) -> None:
    """Django with django-celery-beat's models on ``db_path`` (once per process)."""
    import django
    from django.conf import settings

    if settings.configured:
        return
    settings.configure(
        INSTALLED_APPS=["django_celery_beat"],
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": db_path,
                "OPTIONS": {"timeout": 10},  # beat writes while the test reads
            }
        },
        USE_TZ=True,
        TIME_ZONE="UTC",
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()


def make_app(env: Mapping[str, str]) -> Celery:
    if env.get("BEATAPP_DJANGO_DB"):
        setup_django(env["BEATAPP_DJANGO_DB"])
    app = make_worker_app(env)
    redis_url = worker_settings(env)["redis"]
    prefix = worker_settings(env)["prefix"]
    app.conf.update(
        resilience_drain_rate=float(env.get("BEATAPP_DRAIN_RATE", "10")),
        resilience_drain_batch=int(env.get("BEATAPP_DRAIN_BATCH", "5")),
        redbeat_redis_url=redis_url,
        redbeat_key_prefix=f"{prefix}:redbeat:",
        # Set, so RedBeat does not hand the broker's transport options to its Redis client.
        redbeat_redis_options={},
    )
    if env.get("BEATAPP_SCHEDULE", "entry") == "entry":
        every = float(env.get("BEATAPP_DRAIN_EVERY", "1"))
        app.conf.beat_schedule = {
            DRAIN_ENTRY: Resilience.for_app(app).beat_schedule(every=every),
        }
    return app


def migrate_and_make_row(every: float) -> None:
    """``python -c`` entry: create django-celery-beat's tables, then the drain's row made by
    ``celery_resilience.beat.periodic_task`` when ``BEATAPP_SCHEDULE=none``."""
    from django.core.management import call_command

    from celery_resilience.beat import periodic_task

    call_command("migrate", verbosity=0)
    if os.environ.get("BEATAPP_SCHEDULE") == "none":
        periodic_task(app, every=every, name=DRAIN_ENTRY)


app = make_app(os.environ)
