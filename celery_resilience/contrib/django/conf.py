"""Which Celery app the admin works on, read when a page needs it (never at import time).

``CELERY_RESILIENCE_APP`` is the dotted path of the app (``"proj.celery:app"`` or
``"proj.celery.app"``); without it, ``celery.current_app`` (the app Django's ``celery.py``
usually makes current).

The web process loads the app's task modules once, as a worker does at start
(``known_tasks.load_task_modules``): otherwise a task found only by autodiscovery is not
registered there, and the pages would show it as unknown.
"""

from __future__ import annotations

from typing import Any, cast

from ...known_tasks import load_task_modules
from ...resilience import Resilience

SETTING = "CELERY_RESILIENCE_APP"


def celery_app() -> Any:
    """The Celery app named by ``CELERY_RESILIENCE_APP``, else the current app."""
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    path = getattr(settings, SETTING, None)
    if not path:
        from celery import current_app

        return current_app._get_current_object()
    from kombu.utils.imports import symbol_by_name

    try:
        app = cast(Any, symbol_by_name)(path)  # kombu annotates it in some releases only
    except (ImportError, AttributeError, ValueError) as exc:
        raise ImproperlyConfigured(
            f"{SETTING} must be the dotted path of a Celery app ('proj.celery:app'), "
            f"got {path!r}: {exc}"
        ) from exc
    if not hasattr(app, "conf") or not hasattr(app, "tasks"):
        raise ImproperlyConfigured(f"{SETTING}={path!r} is not a Celery app: {app!r}")
    return app


def resilience() -> Resilience:
    """The app's ``Resilience`` (settings validated on first use), its tasks registered."""
    app = celery_app()
    load_task_modules(app)
    return Resilience.for_app(app)


def database_store_in_use() -> bool:
    """Whether the app parks tasks in this database (``resilience_backout_store = "django"``);
    ``False`` without a usable app (the configured store's page then says what is wrong)."""
    from .store import DjangoBackoutStore

    try:
        return isinstance(resilience().runtime.backout_store, DjangoBackoutStore)
    except Exception:
        return False
