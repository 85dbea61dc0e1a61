"""Admin for parked tasks, whichever store the Celery app uses, and for its breakers.

- "Parked tasks (configured store)": the app's store as ``Resilience.for_app(app).backout``
  sees it (Redis, the database, or another); see ``admin_store.py``.
- "Parked task records (database store)": the table of ``resilience_backout_store = "django"``,
  with the database's own filters and search.
- "Breakers": state and counts of the app's shared breakers; force open (with a note and a
  maintenance window), force closed, reset (``admin_breakers.py``).
- "Overview": parked per breaker and reason, the oldest, the drain and beat
  (``admin_overview.py``).

The index lists one of the two parked-task pages: the records page while the app parks in the
database, the configured store's page otherwise. Both are read-only: entries leave only through
"Replay now" (published at once with their task id, whatever the breaker says; the model's
"replay" permission) or "Discard" (its delete permission), each after a confirmation page and
recorded in ``LogEntry`` (``actions.py``, ``audit.py``).
"""

from __future__ import annotations

from django.contrib import admin

from .admin_breakers import BreakerAdmin
from .admin_overview import OverviewAdmin
from .admin_records import ParkedTaskRecordAdmin
from .admin_store import StoreEntryAdmin
from .models import Breaker, Overview, StoreEntry

admin.site.register(StoreEntry, StoreEntryAdmin)
admin.site.register(Breaker, BreakerAdmin)
admin.site.register(Overview, OverviewAdmin)

__all__ = ["BreakerAdmin", "OverviewAdmin", "ParkedTaskRecordAdmin", "StoreEntryAdmin"]
