"""The admin page of the app's configured back-out store (Redis, the database, or another).

It reads through ``Resilience.for_app(app).backout``, the same view the CLI uses, so it shows
exactly what a drain would see. ``StoreEntry`` has no table: it only gives the page its place in
the admin index and its permissions (view to look, delete to replay or discard).
"""

from __future__ import annotations

import builtins
import time
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from ...parked.entry import REASONS, STATUSES, ParkedTask
from ...parked.store import NO_BREAKER
from . import actions
from .admin_messages import RedactedMessages
from .conf import database_store_in_use, resilience
from .display import ACTION_FIELD, ACTIONS, DISCARD, REPLAY, SELECTED_FIELD, details, summary

#: A search reads at most this many entries (newest first): the store has no text index.
SEARCH_SCAN_LIMIT = 10_000
_SCAN_PAGE = 500
FILTERS = ("breaker", "reason", "status")


def _matches(entry: ParkedTask, needle: str) -> bool:
    return any(needle in text.lower() for text in (entry.task_name, entry.task_id, entry.id))


class StoreEntryAdmin(RedactedMessages, admin.ModelAdmin):  # type: ignore[misc]  # Django is untyped here
    """Read-only list and detail pages over the configured store, with replay and discard."""

    list_per_page = 100

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # no ORM delete: entries leave through replay or discard

    def has_act_permission(self, request: HttpRequest) -> bool:
        """Replay and discard remove entries: they need the model's delete permission."""
        codename = f"{self.opts.app_label}.delete_{self.opts.model_name}"
        return bool(request.user.has_perm(codename))

    def get_model_perms(self, request: HttpRequest) -> dict[str, bool]:
        """No permissions, so no place in the index, while the app parks in the database: the
        database table's own page shows the same entries, with its filters and search."""
        return {} if database_store_in_use() else dict(super().get_model_perms(request))

    def get_urls(self) -> builtins.list[Any]:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        view = self.admin_site.admin_view
        return [
            path("", view(self.changelist_view), name=f"{prefix}_changelist"),
            path("<str:entry_id>/", view(self.detail_view), name=f"{prefix}_change"),
        ]

    def _url(self, name: str, *args: str) -> str:
        opts = self.opts
        return str(
            reverse(f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_{name}", args=args)
        )

    def _context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": title,
            "changelist_url": self._url("changelist"),
            "actions": ACTIONS if self.has_act_permission(request) else (),
            "action_field": ACTION_FIELD,
            "selected_field": SELECTED_FIELD,
            **extra,
        }

    # -- list -----------------------------------------------------------------------------

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            return self._act(request)
        chosen = {f: request.GET.get(f) or None for f in FILTERS}
        for name, allowed in (("reason", REASONS), ("status", STATUSES)):
            if chosen[name] is not None and chosen[name] not in allowed:
                messages.error(request, f"Unknown {name} {chosen[name]!r}: filter ignored.")
                chosen[name] = None
        query = (request.GET.get("q") or "").strip()
        try:
            page = max(0, int(request.GET.get("p", 0)))
        except ValueError:
            page = 0
        context: dict[str, Any] = {"query": query, "page_number": page + 1}
        try:
            backout = resilience().backout
            entries, more = self._page(backout, chosen, query, page)
            breakers = sorted(backout.breakers())
            if not query and chosen["reason"] is None:
                context["total"] = backout.count(chosen["breaker"], chosen["status"])
        except Exception as exc:  # an unreachable store or a bad setting: say so on the page
            context["error"] = f"{type(exc).__name__}: {exc}"
            entries, more, breakers = [], False, []

        def link(**changes: Any) -> str:
            params = {**chosen, "q": query or None, **changes}
            return "?" + urlencode({k: v for k, v in params.items() if v not in (None, "", 0)})

        choices = {"breaker": breakers, "reason": REASONS, "status": STATUSES}
        context["filters"] = [
            {
                "title": name,
                "choices": [
                    {"label": "All", "url": link(**{name: None}), "selected": not chosen[name]},
                    *(
                        {
                            "label": "(none)" if value == NO_BREAKER else value,
                            "url": link(**{name: value}),
                            "selected": chosen[name] == value,
                        }
                        for value in choices[name]
                    ),
                ],
            }
            for name in FILTERS
        ]
        now = time.time()
        context["rows"] = [{**summary(e, now), "url": self._url("change", e.id)} for e in entries]
        context["previous_url"] = link(p=page - 1) if page > 0 else None
        context["next_url"] = link(p=page + 1) if more else None
        context["hidden_filters"] = {k: v for k, v in chosen.items() if v}
        context["search_limit"] = SEARCH_SCAN_LIMIT if query else None
        title = "Parked tasks (configured store)"
        return TemplateResponse(
            request,
            "admin/celery_resilience/store_list.html",
            self._context(request, title, **context, **(extra_context or {})),
        )

    def _page(
        self, backout: Any, chosen: dict[str, Any], query: str, page: int
    ) -> tuple[builtins.list[ParkedTask], bool]:
        """One page of entries, and whether there is another after it."""
        size = self.list_per_page
        if not query:
            found = backout.list(**chosen, limit=size + 1, offset=page * size)
            return found[:size], len(found) > size
        needle, offset = query.lower(), 0
        matches: builtins.list[ParkedTask] = []
        wanted = (page + 1) * size + 1
        while offset < SEARCH_SCAN_LIMIT and len(matches) < wanted:
            batch = backout.list(**chosen, limit=_SCAN_PAGE, offset=offset)
            matches += [e for e in batch if _matches(e, needle)]
            offset += _SCAN_PAGE
            if len(batch) < _SCAN_PAGE:
                break
        shown = matches[page * size : (page + 1) * size]
        return shown, len(matches) > (page + 1) * size

    def _act(self, request: HttpRequest) -> HttpResponse:
        if not self.has_act_permission(request):
            raise PermissionDenied
        action = request.POST.get(ACTION_FIELD)
        selected = request.POST.getlist(SELECTED_FIELD)
        back = request.get_full_path()
        if action not in (REPLAY, DISCARD):
            self.message_user(request, "No action chosen.", messages.WARNING)
        elif not selected:
            self.message_user(
                request, "Select parked tasks to act on: none were chosen.", messages.WARNING
            )
        else:
            backout = resilience().backout
            act = actions.replay if action == REPLAY else actions.discard
            act(self, request, backout, selected)
        return HttpResponseRedirect(back)

    # -- detail ---------------------------------------------------------------------------

    def detail_view(self, request: HttpRequest, entry_id: str) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        try:
            entry = resilience().backout.get(entry_id)
        except Exception as exc:  # an unreachable store or a bad setting
            self.message_user(request, f"{type(exc).__name__}: {exc}", messages.ERROR)
            return HttpResponseRedirect(self._url("changelist"))
        if entry is None:
            self.message_user(
                request,
                f"Parked task {entry_id} is not in the store (replayed or discarded?).",
                messages.WARNING,
            )
            return HttpResponseRedirect(self._url("changelist"))
        return TemplateResponse(
            request,
            "admin/celery_resilience/entry_detail.html",
            self._context(
                request,
                f"{entry.task_name}[{entry.task_id}]",
                entry=entry,
                rows=details(entry),
                action_url=self._url("changelist"),
            ),
        )
