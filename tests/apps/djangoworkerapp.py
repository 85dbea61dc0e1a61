"""``tests.apps.workerapp`` with its tasks parked in a Django database (the ORM back-out store).

``DJANGOAPP_DB`` is the SQLite file (the test made it and runs ``migrate()`` on it first); the
other ``WORKERAPP_*`` variables are those of ``tests.apps.workerapp``.
"""

from __future__ import annotations

import os

import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["celery_resilience.contrib.django"],
    DATABASES={
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ["DJANGOAPP_DB"],
            "OPTIONS": {"timeout": 2},
        }
    },
    USE_TZ=True,
    DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
)
django.setup()

from tests.apps.workerapp import make_app  # noqa: E402 - Django first

app = make_app(os.environ)
app.conf.resilience_backout_store = "django"


def migrate() -> None:
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
