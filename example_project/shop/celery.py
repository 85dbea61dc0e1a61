"""The shop's Celery app: every setting comes from Django's settings (``CELERY_*`` names).

``celery -A shop worker`` / ``celery -A shop beat`` / ``celery -A shop resilience status``
find it here. The drain of parked tasks is in ``CELERY_BEAT_SCHEDULE`` (see settings).
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")

app = Celery("shop")
# CELERY_RESILIENCE_BREAKERS -> app.conf.resilience_breakers, and so on.
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
