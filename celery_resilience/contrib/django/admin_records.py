"""The admin page of the database store's table (``resilience_backout_store = "django"``):
Django's own changelist, with its filters and search, decoded rows and the same actions, asking
first, as the configured store's page.
"""

from __future__ import annotations

import time
from typing import Any

from django.contrib import admin, messages
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from ...backout.masking import EVERYTHING
from ...known_tasks import masking_of
from . import actions, audit
from .admin_messages import RedactedMessages
from .conf import database_store_in_use, resilience
from .display import (
    ACTION_FIELD,
    ACTIONS,
    DISCARD,
    RECHECK,
    REPLAY,
    SELECTED_FIELD,
    details,
    iso,
    relative,
    short,
    summary,
    when,
)
from .display import due as due_text
from .estimates import EstimatedPaginator, distinct_values
from .holding import breaker_states
from .models import ParkedTaskRecord
from .search import matcher, scan
from .store import DjangoBackoutStore


class BreakerFilter(admin.AllValuesFieldListFilter):
    """Django's filter of every value, its values read by walking the index on PostgreSQL
    (``SELECT DISTINCT`` would read all of it, on every page load)."""

    def __init__(
        self,
        field: Any,
        request: HttpRequest,
        params: Any,
        model: Any,
        model_admin: Any,
        field_path: str,
    ) -> None:
        super().__init__(field, request, params, model, model_admin, field_path)
        using = model_admin.get_queryset(request).db
        names = distinct_values(model, using, field.column)
        if names is not None:
            self.lookup_choices = names


@admin.register(ParkedTaskRecord)
class ParkedTaskRecordAdmin(RedactedMessages, admin.ModelAdmin):
    list_display = (
        "entry",
        "task_name",
        "task",
        "arguments",
        "breaker",
        "reason",
        "error",
        "state",
        "parked",
        "due",
    )
    list_filter = (("breaker", BreakerFilter), "reason", "status", ("task_name", BreakerFilter))
    # Ids by their start (a pasted task id, or its first characters), not anywhere inside:
    # "15" must not find every id holding "15". Arguments: ``get_search_results``.
    search_fields = ("task_name", "^task_id", "^id")
    ordering = ("-parked_at", "-id")
    list_per_page = 100
    # A store that holds an outage has millions of rows: no COUNT(*) of them on every page
    # load. The total is PostgreSQL's estimate past EXACT_BELOW rows (the page says "about").
    paginator = EstimatedPaginator
    show_full_result_count = False
    actions = ("replay_now", "discard", "recheck")
    change_list_template = "admin/celery_resilience/record_list.html"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # "Discard" instead: it asks first, reports back, and leaves a trace

    def has_replay_permission(self, request: HttpRequest) -> bool:
        """Replay sends tasks to the workers again: the model's own "replay" permission."""
        return bool(request.user.has_perm(f"{self.opts.app_label}.replay_{self.opts.model_name}"))

    def has_discard_permission(self, request: HttpRequest) -> bool:
        """Discard removes entries for good: the model's delete permission."""
        return bool(request.user.has_perm(f"{self.opts.app_label}.delete_{self.opts.model_name}"))

    def get_model_perms(self, request: HttpRequest) -> dict[str, bool]:
        """In the index only while the app parks in the database (else the table is empty)."""
        return dict(super().get_model_perms(request)) if database_store_in_use() else {}

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        """The page's rows decoded once each, and the state of their breakers read once a
        breaker (not a row): the columns below read what is attached here."""
        changelist = super().get_changelist_instance(request)
        records = list(changelist.result_list)
        if records:
            store = self._store(records[0]._state.db)
            for record in records:
                record.resilience_entry = store.read_record(record)
            try:
                res = resilience()
                states = breaker_states(res, [r.resilience_entry for r in records])
                masking = masking_of(res.runtime)
            except Exception:  # no usable app: the page still lists the table
                states, masking = {}, EVERYTHING
            for record in records:
                record.resilience_row = summary(
                    record.resilience_entry, time.time(), masking, states
                )
        changelist.result_list = records
        return changelist

    def get_search_results(self, request: HttpRequest, queryset: Any, search_term: str) -> Any:
        """Django's search over names and ids, or the arguments as a person sees them
        (masked) in the newest ``SCAN_LIMIT`` rows the filters keep: they are in the payload,
        which no index covers (and may be encrypted)."""
        found, duplicates = super().get_search_results(request, queryset, search_term)
        if not search_term.strip():
            return found, duplicates
        store = self._store(queryset.db)
        try:
            masking = masking_of(resilience().runtime)
        except Exception:
            masking = EVERYTHING
        matches = matcher(search_term, masking)
        rows = queryset.order_by("-parked_at", "-id")

        def pages(offset: int, count: int) -> list[Any]:
            return [store.read_record(r) for r in rows[offset : offset + count]]

        hits = [entry.id for entry in scan(pages, matches).entries]
        return queryset.filter(Q(pk__in=found.values("pk")) | Q(pk__in=hits)), duplicates

    # Short ids and relative times keep a row on one line; the whole text is the hover title.
    @admin.display(description="entry id", ordering="id")
    def entry(self, record: ParkedTaskRecord) -> str:
        return str(format_html('<span title="{}">{}</span>', record.id, short(record.id)))

    @admin.display(description="task id", ordering="task_id")
    def task(self, record: ParkedTaskRecord) -> str:
        return str(format_html('<span title="{}">{}</span>', record.task_id, short(record.task_id)))

    @admin.display(description="arguments")
    def arguments(self, record: ParkedTaskRecord) -> str:
        row = _row(record)
        return str(format_html('<span title="{}">{}</span>', row["args_whole"], row["args"]))

    @admin.display(description="error")
    def error(self, record: ParkedTaskRecord) -> str:
        row = _row(record)
        return str(format_html('<span title="{}">{}</span>', row["error"], row["error"]))

    @admin.display(description="status", ordering="status")
    def state(self, record: ParkedTaskRecord) -> str:
        text = f"{record.status}: {record.dead_reason}" if record.dead_reason else record.status
        return str(format_html('<span title="{}">{}</span>', text, text))

    @admin.display(description="parked", ordering="parked_at")
    def parked(self, record: ParkedTaskRecord) -> str:
        return str(
            format_html(
                '<time datetime="{}" title="{}">{}</time>',
                iso(record.parked_at),
                when(record.parked_at),
                relative(record.parked_at, time.time()),
            )
        )

    @admin.display(description="due", ordering="due_at")
    def due(self, record: ParkedTaskRecord) -> str:
        row = _row(record)
        text = row["due"] or due_text(record.status, record.reason, record.due_at, time.time())
        held = ' class="held"' if row["held"] else ""
        return str(format_html('<span title="{}"' + held + ">{}</span>", when(record.due_at), text))

    def _store(self, using: str) -> DjangoBackoutStore:
        """The app's database store on ``using`` (its serializer and keys)."""
        try:
            app = resilience()
            return DjangoBackoutStore(codec=app.runtime.codec(), using=using)
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

    def _ask_or_do(self, request: HttpRequest, queryset: Any, action: str) -> Any:
        """The confirmation page, or (its POST) the action on every row of ``queryset``."""
        store = self._store(queryset.db)
        entries = [store.read_record(record) for record in queryset.order_by("-parked_at", "-id")]
        if not entries:
            self.message_user(
                request, "None of these entries is in the table now.", messages.WARNING
            )
            return None
        if request.POST.get(actions.CONFIRMED) != "yes":
            try:
                res: Any = resilience()
            except Exception:
                res = None
            across = request.POST.get(actions.ACROSS) == "1"
            changelist = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist")
            extra = {
                "changelist_url": changelist,
                "back_url": request.get_full_path(),
                "query": request.GET.get("q", ""),
            }
            target = actions.Target(entries, across=across)
            return actions.confirm(self, request, action, target, res, extra)
        reason = audit.clean_reason(request.POST.get(actions.REASON))
        if action == REPLAY:
            backout = self._backout(request, queryset.db)
            if backout is not None:
                actions.replay(self, request, backout, entries, reason)
        elif action == RECHECK:
            actions.recheck(self, request, store, entries, reason)
        else:
            actions.discard(self, request, store, entries, reason)
        return None

    @admin.action(description="Replay now", permissions=["replay"])
    def replay_now(self, request: HttpRequest, queryset: Any) -> Any:
        return self._ask_or_do(request, queryset, REPLAY)

    @admin.action(description="Discard", permissions=["discard"])
    def discard(self, request: HttpRequest, queryset: Any) -> Any:
        return self._ask_or_do(request, queryset, DISCARD)

    @admin.action(description="Re-check dead entries", permissions=["replay"])
    def recheck(self, request: HttpRequest, queryset: Any) -> Any:
        """Park again the dead entries this process reads and verifies (``repair``)."""
        return self._ask_or_do(request, queryset, RECHECK)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if request.method == "GET":
            try:
                store = resilience().runtime.backout_store
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
        if record is None:  # a Celery task id (a replay parked it again under a new entry id)
            again = self.get_queryset(request).filter(task_id=object_id)
            newest = again.order_by("-parked_at", "-id").first()
            if newest is not None:
                name = f"admin:{self.opts.app_label}_{self.opts.model_name}_change"
                return HttpResponseRedirect(reverse(name, args=(newest.pk,)))
            self.message_user(
                request,
                f"Parked task {object_id} is not in the table (replayed or discarded?); no "
                "entry has that task id either.",
                messages.WARNING,
            )
            return HttpResponseRedirect(changelist)
        entry = self._store(record._state.db).read_record(record)
        try:
            res = resilience()
            states, masking = (
                breaker_states(res, [entry]),
                masking_of(res.runtime),
            )
        except Exception:  # no usable app: the record still shows, unmasked by no setting
            states, masking = {}, EVERYTHING
        extra = (
            ("Claimed until", when(record.lease_until)),
            ("Died at", when(record.died_at)),
            ("Breaker state", states.get(entry.breaker or "", "—")),
            ("Due", summary(entry, time.time(), masking, states)["due"]),
        )
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"{entry.task_name}[{entry.task_id}]",
            "changelist_url": changelist,
            "actions": tuple(
                (value, label)
                for value, label in ACTIONS
                if (
                    self.has_discard_permission if value == DISCARD else self.has_replay_permission
                )(request)
            ),
            "action_field": ACTION_FIELD,
            "selected_field": SELECTED_FIELD,
            "entry": entry,
            "rows": details(entry, *extra, masking=masking),
            "action_url": changelist,
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/celery_resilience/entry_detail.html", context)


def _row(record: ParkedTaskRecord) -> dict[str, Any]:
    """The row ``get_changelist_instance`` attached (an empty one outside a list page)."""
    return getattr(record, "resilience_row", None) or {
        "args": "",
        "args_whole": "",
        "error": "",
        "due": "",
        "held": False,
    }
