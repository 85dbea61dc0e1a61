"""``tests.apps.cliapp`` with its parked tasks in a PostgreSQL database (the ORM back-out store):
``celery -A tests.apps.djangocliapp resilience ...``.

``CLIAPP_PG_NAME`` names the database (the test made it, as Django's test runner does); the
server is the suite's (``tests.support.django_settings``). The other ``CLIAPP_*`` variables are
those of ``tests.apps.cliapp``.
"""

from __future__ import annotations

import os

import django
from django.conf import settings

from tests.support import django_settings

settings.configure(
    INSTALLED_APPS=["celery_resilience.contrib.django"],
    DATABASES={
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "HOST": django_settings.PG_HOST,
            "PORT": django_settings.PG_PORT,
            "USER": django_settings.PG_USER,
            "NAME": os.environ["CLIAPP_PG_NAME"],
        }
    },
    USE_TZ=True,
    DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
)
django.setup()

from tests.apps.cliapp import make_app  # noqa: E402 - Django first

app = make_app(os.environ)
app.conf.resilience_backout_store = "django"
