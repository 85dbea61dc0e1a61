"""The Django app of celery-resilience: models, migrations and admin."""

from __future__ import annotations

from django.apps import AppConfig


class CeleryResilienceConfig(AppConfig):
    name = "celery_resilience.contrib.django"
    label = "celery_resilience"
    verbose_name = "Celery resilience"
    default_auto_field = "django.db.models.BigAutoField"
