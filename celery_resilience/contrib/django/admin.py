"""Admin for parked tasks, whichever store the Celery app uses, and for its breakers.

- "Parked tasks (configured store)": the app's store as ``Resilience.for_app(app).backout``
  sees it (Redis, the database, or another); see ``admin_store.py``.
- "Parked task records (database store)": the table of ``resilience_backout_store = "django"``,
  with the database's own filters and search.
- "Breakers": state and counts of the app's shared breakers; force open, force closed, reset
  (``admin_breakers.py``).

The index lists one of the two parked-task pages: the records page while the app parks in the
database, the configured store's page otherwise. Both are read-only: entries leave only through
"Replay now" (published at once with their task id, whatever the breaker says) or "Discard",
which need the model's delete permission.
"""

from __future__ import annotations

import time
from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from ...parked.codec import Codec
from . import actions
from .admin_breakers import BreakerAdmin
from .admin_messages import RedactedMessages
from .admin_store import StoreEntryAdmin
from .conf import database_store_in_use, resilience
from .display import ACTION_FIELD, ACTIONS, SELECTED_FIELD, details, iso, relative, short, when
from .display import due as due_text
from .models import Breaker, ParkedTaskRecord, StoreEntry
from .store import DjangoBackoutStore

admin.site.register(StoreEntry, StoreEntryAdmin)
admin.site.register(Breaker, BreakerAdmin)


@admin.register(ParkedTaskRecord)
class ParkedTaskRecordAdmin(RedactedMessages, admin.ModelAdmin):  # type: ignore[misc]  # Django is untyped here
    list_display = ("entry", "task_name", "task", "breaker", "reason", "status", "parked", "due")
    list_filter = ("breaker", "reason", "status")
    search_fields = ("task_name", "task_id", "=id")
    ordering = ("-parked_at", "-id")
    list_per_page = 100
    actions = ("replay_now", "discard")
    change_list_template = "admin/celery_resilience/record_list.html"

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).defer("payload")  # lists don't need the bytes

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # "Discard" instead: it reports back, and no cascade page is needed

    def has_act_permission(self, request: HttpRequest) -> bool:
        """Replay and discard remove entries: they need the model's delete permission."""
        return bool(request.user.has_perm(f"{self.opts.app_label}.delete_{self.opts.model_name}"))

    def get_model_perms(self, request: HttpRequest) -> dict[str, bool]:
        """In the index only while the app parks in the database (else the table is empty)."""
        return dict(super().get_model_perms(request)) if database_store_in_use() else {}

    # Short ids and relative times keep a row on one line; the whole text is the hover title.
    @admin.display(description="entry id", ordering="id")  # type: ignore[untyped-decorator]
    def entry(self, record: ParkedTaskRecord) -> str:
        return str(format_html('<span title="{}">{}</span>', record.id, short(record.id)))

    @admin.display(description="task id", ordering="task_id")  # type: ignore[untyped-decorator]
    def task(self, record: ParkedTaskRecord) -> str:
        return str(format_html('<span title="{}">{}</span>', record.task_id, short(record.task_id)))

    @admin.display(description="parked", ordering="parked_at")  # type: ignore[untyped-decorator]
    def parked(self, record: ParkedTaskRecord) -> str:
        return str(
            format_html(
                '<time datetime="{}" title="{}">{}</time>',
                iso(record.parked_at),
                when(record.parked_at),
                relative(record.parked_at, time.time()),
            )
        )

    @admin.display(description="due", ordering="due_at")  # type: ignore[untyped-decorator]
    def due(self, record: ParkedTaskRecord) -> str:
        text = due_text(record.status, record.reason, record.due_at, time.time())
        return str(format_html('<span title="{}">{}</span>', when(record.due_at), text))

    def _store(self, using: str) -> DjangoBackoutStore:
        """The app's database store on ``using`` (its serializer and keys)."""
        try:
            app = resilience()
            return DjangoBackoutStore(codec=Codec.of(app.config), using=using)
        except Exception:  # no usable Celery app: decode as Celery's defaults would (JSON)
            return DjangoBackoutStore(using=using)

    def _backout(self, request: HttpRequest, using: str) -> Any:
        """The app's back-out view if its store is this table; ``None`` (and why) otherwise."""
        try:
            backout = resilience().backout
        except Exception as exc:
            self.message_user(request, f"No usable Celery app: {exc}", messages.ERROR)
            return None
        store = backout.store
        if not isinstance(store, DjangoBackoutStore) or store.using != using:
            self.message_user(
                request,
                f"The Celery app parks tasks in {type(store).__name__}, not in this table: "
                "replay them from “Parked tasks (configured store)”.",
                messages.ERROR,
            )
            return None
        return backout

    @admin.action(description="Replay now", permissions=["act"])  # type: ignore[untyped-decorator]
    def replay_now(self, request: HttpRequest, queryset: Any) -> None:
        backout = self._backout(request, queryset.db)
        if backout is not None:
            actions.replay(self, request, backout, queryset.values_list("pk", flat=True))

    @admin.action(description="Discard", permissions=["act"])  # type: ignore[untyped-decorator]
    def discard(self, request: HttpRequest, queryset: Any) -> None:
        store = self._store(queryset.db)
        ids = list(queryset.values_list("pk", flat=True))
        actions.discard(self, request, store, ids)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if request.method == "GET":
            try:
                store = resilience().backout_store
            except Exception as exc:
                self.message_user(request, f"No usable Celery app: {exc}", messages.WARNING)
            else:
                if not isinstance(store, DjangoBackoutStore):
                    self.message_user(
                        request,
                        f"The Celery app parks tasks in {type(store).__name__}, not in this "
                        "table: see “Parked tasks (configured store)”.",
                        messages.INFO,
                    )
        return super().changelist_view(request, extra_context)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        """The same read-only detail page as the configured store's (decoded payload)."""
        if not self.has_view_or_change_permission(request):
            return super().change_view(request, object_id, form_url, extra_context)
        record = self.get_object(request, object_id)
        changelist = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist")
        if record is None:
            self.message_user(
                request, f"Parked task {object_id} is not in the table.", messages.WARNING
            )
            return HttpResponseRedirect(changelist)
        entry = self._store(record._state.db).read_record(record)
        extra = (("Claimed until", when(record.lease_until)), ("Died at", when(record.died_at)))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"{entry.task_name}[{entry.task_id}]",
            "changelist_url": changelist,
            "actions": ACTIONS if self.has_act_permission(request) else (),
            "action_field": ACTION_FIELD,
            "selected_field": SELECTED_FIELD,
            "entry": entry,
            "rows": details(entry, *extra),
            "action_url": changelist,
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/celery_resilience/entry_detail.html", context)
