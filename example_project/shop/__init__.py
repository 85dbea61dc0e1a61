"""The shop's Django project; its Celery app loads with Django, as Celery's docs recommend."""

from .celery import app as celery_app

__all__ = ("celery_app",)
