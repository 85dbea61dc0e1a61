"""The admin page of the app's configured back-out store (Redis, the database, or another).

It reads through ``Resilience.for_app(app).backout``, the same view the CLI uses, so it shows
exactly what a drain would see. ``StoreEntry`` has no table: it only gives the page its place in
the admin index and its permissions (view to look, "replay" to replay, delete to discard).

Filters by breaker, reason and status are the store's own (one read a page); the search and
the task filter read entries, newest first, up to ``search.SCAN_LIMIT`` (see ``search.py``).
An action covers the ticked entries, or with "Select all N" every entry the filter and search
match, and always goes through a confirmation page.
"""

from __future__ import annotations

import builtins
import math
import time
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from ...backout.entry import REASONS, STATUSES, ParkedTask
from ...backout.masking import SHOW_ALL, Masking
from ...backout.store import NO_BREAKER, Filter
from ...known_tasks import masking_of
from ...task import ResilientTask
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
    summary,
)
from .holding import breaker_states
from .search import SCAN_LIMIT, Scan, by_task, matcher, scan

FILTERS = ("breaker", "reason", "status", "task")
#: Filters the store itself applies (the task filter is a scan).
STORE_FILTERS = ("breaker", "reason", "status")


class StoreEntryAdmin(RedactedMessages, admin.ModelAdmin):
    """Read-only list and detail pages over the configured store, with replay and discard."""

    list_per_page = 100

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # no ORM delete: entries leave through replay or discard

    def has_replay_permission(self, request: HttpRequest) -> bool:
        """Replay sends tasks to the workers again: the model's own "replay" permission."""
        return bool(request.user.has_perm(f"{self.opts.app_label}.replay_{self.opts.model_name}"))

    def has_discard_permission(self, request: HttpRequest) -> bool:
        """Discard removes entries for good: the model's delete permission."""
        return bool(request.user.has_perm(f"{self.opts.app_label}.delete_{self.opts.model_name}"))

    def allowed_actions(self, request: HttpRequest) -> tuple[tuple[str, str], ...]:
        return tuple((value, label) for value, label in ACTIONS if self._may(value, request))

    def _may(self, action: str, request: HttpRequest) -> bool:
        """Discard needs the delete permission; replay and re-check (which parks entries
        again, for a drain to send) the replay permission."""
        if action == DISCARD:
            return self.has_discard_permission(request)
        return self.has_replay_permission(request)

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
            "actions": self.allowed_actions(request),
            "action_field": ACTION_FIELD,
            "selected_field": SELECTED_FIELD,
            **extra,
        }

    # -- list -----------------------------------------------------------------------------

    def _chosen(self, request: HttpRequest) -> tuple[dict[str, Any], str]:
        """The filters and the search of the request (a bad reason or status ignored)."""
        chosen = {f: request.GET.get(f) or None for f in FILTERS}
        for name, allowed in (("reason", REASONS), ("status", STATUSES)):
            if chosen[name] is not None and chosen[name] not in allowed:
                messages.error(request, f"Unknown {name} {chosen[name]!r}: filter ignored.")
                chosen[name] = None
        return chosen, (request.GET.get("q") or "").strip()

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            return self._act(request)
        chosen, query = self._chosen(request)
        try:
            wanted = max(1, int(request.GET.get("p", 1)))
        except ValueError:
            wanted = 1
        size = self.list_per_page
        context: dict[str, Any] = {"query": query}
        entries: builtins.list[ParkedTask] = []
        breakers: builtins.list[str] = []
        tasks: builtins.list[str] = []
        total: int | None = 0
        states: dict[str, str] = {}
        masking: Masking = SHOW_ALL
        page, pages = 1, 1
        try:
            res = resilience()
            backout = res.backout
            masking = masking_of(res.runtime)
            if query or chosen["task"]:
                found = self._scan(backout, chosen, query, masking)
                total, context["cut"] = len(found.entries), found.cut
                pages = max(1, math.ceil(total / size))
                page = min(wanted, pages)
                entries = found.entries[(page - 1) * size : page * size]
            else:
                total = backout.store.count(_where(chosen))
                pages = max(1, math.ceil(total / size))
                page = min(wanted, pages)
                entries = backout.list(
                    **_store_filters(chosen), limit=size, offset=(page - 1) * size
                )
            breakers = sorted(backout.breakers())
            tasks = self._task_names(res, backout, chosen["task"])
            states = breaker_states(res, entries)
        except Exception as exc:  # an unreachable store or a bad setting: say so on the page
            context["error"] = f"{type(exc).__name__}: {exc}"
            total = None

        def link(**changes: Any) -> str:
            params = {**chosen, "q": query or None, **changes}
            return "?" + urlencode({k: v for k, v in params.items() if v not in (None, "", 1)})

        choices = {"breaker": breakers, "reason": REASONS, "status": STATUSES, "task": tasks}
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
        context["rows"] = [
            {**summary(e, now, masking, states), "url": self._url("change", e.id)} for e in entries
        ]
        context.update(
            total=total,
            page_number=page,
            pages=pages,
            first_url=link(p=None) if page > 1 else None,
            previous_url=link(p=page - 1) if page > 1 else None,
            next_url=link(p=page + 1) if page < pages else None,
            last_url=link(p=pages) if page < pages else None,
            hidden_filters={k: v for k, v in chosen.items() if v},
            search_limit=SCAN_LIMIT,
            searching=bool(query or chosen["task"]),
            scan_limit=SCAN_LIMIT,
        )
        title = "Parked tasks (configured store)"
        return TemplateResponse(
            request,
            "admin/celery_resilience/store_list.html",
            self._context(request, title, **context, **(extra_context or {})),
        )

    def _scan(self, backout: Any, chosen: dict[str, Any], query: str, masking: Masking) -> Scan:
        """Entries of the store's filters that match the search and the task filter."""
        text, task = matcher(query, masking), by_task(chosen["task"])
        filters = _store_filters(chosen)

        def pages(offset: int, count: int) -> builtins.list[ParkedTask]:
            return list(backout.list(**filters, limit=count, offset=offset))

        return scan(pages, lambda entry: task(entry) and text(entry))

    def _task_names(self, res: Any, backout: Any, chosen: str | None) -> builtins.list[str]:
        """The task filter's choices: the app's resilient tasks and those of the newest
        entries (one read of a page), so a task that is no longer registered can be picked."""
        names = {t.name for t in res.runtime.app.tasks.values() if isinstance(t, ResilientTask)}
        names |= {entry.task_name for entry in backout.list(limit=self.list_per_page)}
        if chosen:
            names.add(chosen)
        return sorted(names)

    # -- actions --------------------------------------------------------------------------

    def _act(self, request: HttpRequest) -> HttpResponse:
        action = request.POST.get(ACTION_FIELD)
        back = request.get_full_path()
        if action not in (REPLAY, DISCARD, RECHECK):
            self.message_user(request, "No action chosen.", messages.WARNING)
            return HttpResponseRedirect(back)
        if not self._may(action, request):
            raise PermissionDenied
        across = request.POST.get(actions.ACROSS) == "1"
        selected = request.POST.getlist(SELECTED_FIELD)
        if not across and not selected:
            self.message_user(
                request, "Select parked tasks to act on: none were chosen.", messages.WARNING
            )
            return HttpResponseRedirect(back)
        try:
            res = resilience()
            target = self._target(res, request, selected, across)
        except Exception as exc:
            self.message_user(request, f"{type(exc).__name__}: {exc}", messages.ERROR)
            return HttpResponseRedirect(back)
        if not target.entries:
            self.message_user(
                request, "None of these entries is in the store now.", messages.WARNING
            )
            return HttpResponseRedirect(back)
        if request.POST.get(actions.CONFIRMED) != "yes":
            _, query = self._chosen(request)
            extra = {"changelist_url": self._url("changelist"), "back_url": back, "query": query}
            return actions.confirm(self, request, action, target, res, extra)
        reason = audit.clean_reason(request.POST.get(actions.REASON))
        if action == RECHECK:
            store = res.runtime.backout_store
            actions.recheck(self, request, store, target.entries, reason)
        else:
            act = actions.replay if action == REPLAY else actions.discard
            act(self, request, res.backout, target.entries, reason)
        if target.missing:
            self.message_user(
                request,
                f"{target.missing} of the chosen entries "
                f"{'was' if target.missing == 1 else 'were'} no longer in the store.",
                messages.WARNING,
            )
        return HttpResponseRedirect(back)

    def _target(
        self, res: Any, request: HttpRequest, selected: builtins.list[str], across: bool
    ) -> actions.Target:
        """The ticked entries, or every entry the request's filter and search match."""
        backout = res.backout
        if not across:
            found = [backout.get(entry_id) for entry_id in dict.fromkeys(selected)]
            entries = [entry for entry in found if entry is not None]
            return actions.Target(entries, missing=len(found) - len(entries))
        chosen, query = self._chosen(request)
        if query or chosen["task"]:
            hit = self._scan(backout, chosen, query, masking_of(res.runtime))
            return actions.Target(hit.entries, across=True, cut=hit.cut)
        filters = _store_filters(chosen)
        every = scan(
            lambda offset, count: list(backout.list(**filters, limit=count, offset=offset)),
            lambda entry: True,
            limit=max(SCAN_LIMIT, backout.store.count(_where(chosen))),
        )
        return actions.Target(every.entries, across=True)

    # -- detail ---------------------------------------------------------------------------

    def detail_view(self, request: HttpRequest, entry_id: str) -> HttpResponse:
        """One entry, by its entry id or by its Celery task id (a replay that parked it again
        gave it a new entry id: the task id, what Flower and the logs show, stays)."""
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        try:
            res = resilience()
            entry = res.backout.get(entry_id)
            if entry is None:  # the newest entry of that task id (every store indexes or scans)
                newest = res.runtime.backout_store.with_task_id(entry_id, limit=1)
                if newest:
                    return HttpResponseRedirect(self._url("change", newest[0].id))
            states = {} if entry is None else breaker_states(res, [entry])
        except Exception as exc:  # an unreachable store or a bad setting
            self.message_user(request, f"{type(exc).__name__}: {exc}", messages.ERROR)
            return HttpResponseRedirect(self._url("changelist"))
        if entry is None:
            self.message_user(
                request,
                f"Parked task {entry_id} is not in the store (replayed or discarded?); no "
                f"entry has that task id either.",
                messages.WARNING,
            )
            return HttpResponseRedirect(self._url("changelist"))
        line = summary(entry, time.time(), SHOW_ALL, states)  # its due time only
        return TemplateResponse(
            request,
            "admin/celery_resilience/entry_detail.html",
            self._context(
                request,
                f"{entry.task_name}[{entry.task_id}]",
                entry=entry,
                rows=details(
                    entry,
                    ("Breaker state", states.get(entry.breaker or "", "—")),
                    ("Due", line["due"]),
                    masking=masking_of(res.runtime),
                ),
                action_url=self._url("changelist"),
            ),
        )


def _store_filters(chosen: dict[str, Any]) -> dict[str, Any]:
    return {name: chosen[name] for name in STORE_FILTERS}


def _where(chosen: dict[str, Any]) -> Filter:
    """The store's filter of the page's breaker, reason and status (a total under filters)."""
    return Filter(chosen["breaker"], chosen["status"], chosen["reason"])
