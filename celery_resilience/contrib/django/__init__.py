"""Django integration: a back-out store in the database, and an admin for parked tasks and
breakers.

Add ``"celery_resilience.contrib.django"`` to ``INSTALLED_APPS`` and run ``migrate``. Set
``CELERY_RESILIENCE_BACKOUT_STORE = "django"`` (the app's ``resilience_backout_store``) to park
tasks in the database instead of Redis; the admin shows whichever store the app uses, and the
app's shared breakers. The admin finds the Celery app through ``CELERY_RESILIENCE_APP``
(``"proj.celery:app"``), else ``celery.current_app``. Nothing here reads a setting at import
time.
"""
