"""The admin's overview page: what is parked, per breaker and reason; the oldest parked task;
the last drain and whether one runs; whether beat is alive; the breakers by state.

``Overview`` has no table: it gives the page its place in the admin index and its view
permission. The page says what it could not read (Redis or the database away) instead of
showing zeros.
"""

from __future__ import annotations

import builtins
from collections import Counter
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse

from ...backout.entry import REASONS
from ...redact import redact
from . import overview
from .admin_breakers import breaker_names
from .admin_messages import RedactedMessages
from .conf import database_store_in_use, resilience
from .display import relative, when

#: Beat counts as alive while the drain task ran within this many of its periods.
MISSED_PERIODS = 3


class OverviewAdmin(RedactedMessages, admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> builtins.list[Any]:
        name = f"{self.opts.app_label}_{self.opts.model_name}_changelist"
        return [path("", self.admin_site.admin_view(self.changelist_view), name=name)]

    def _list_url(self, in_database: bool, **query: str) -> str:
        page = "parkedtaskrecord" if in_database else "storeentry"
        if in_database:  # Django's own filters
            query = {k if k == "q" else f"{k}__exact": v for k, v in query.items()}
        url = reverse(f"{self.admin_site.name}:{self.opts.app_label}_{page}_changelist")
        return f"{url}?{urlencode(query)}" if query else str(url)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        context: dict[str, Any] = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Overview",
            "reasons": REASONS,
            "errors": [],
            "breakers_url": reverse(f"{self.admin_site.name}:celery_resilience_breaker_changelist"),
        }
        try:
            res = resilience()
        except Exception as exc:
            context["errors"].append(redact(f"No usable Celery app: {type(exc).__name__}: {exc}"))
            return self._render(request, context, extra_context)
        in_database = database_store_in_use()
        self._store_part(res, in_database, context)
        self._drain_part(res, context)
        self._breaker_part(res, context)
        return self._render(request, context, extra_context)

    def _render(self, request: HttpRequest, context: dict[str, Any], extra: Any) -> HttpResponse:
        context.update(extra or {})
        return TemplateResponse(request, "admin/celery_resilience/overview.html", context)

    def _store_part(self, res: Any, in_database: bool, context: dict[str, Any]) -> None:
        try:
            lines = overview.rows(overview.by_breaker_and_reason(res.backout.store))
            for line in lines:
                line["url"] = self._list_url(in_database, breaker=line["breaker"])
                line["links"] = [
                    (n, self._list_url(in_database, breaker=line["breaker"], reason=r))
                    for n, r in zip(line["cells"], REASONS, strict=True)
                ]
            first = overview.oldest(res.backout)
            now = res.runtime.now()
        except Exception as exc:  # the store is away: say so, claim no zero
            context["errors"].append(redact(f"The back-out store: {type(exc).__name__}: {exc}"))
            return
        context["store_read"] = True
        context["lines"] = lines
        context["parked"] = sum(sum(line["cells"]) for line in lines)
        context["dead"] = sum(line["dead"] for line in lines)
        context["store_kind"] = type(res.backout.store).__name__
        context["list_url"] = self._list_url(in_database)
        if first is not None:
            context["oldest"] = {
                "age": relative(first.parked_at, now),
                "exact": when(first.parked_at),
                "task": f"{first.task_name}[{first.task_id}]",
                "breaker": first.breaker or "(none)",
                "url": self._list_url(in_database, q=first.task_id),
            }

    def _drain_part(self, res: Any, context: dict[str, Any]) -> None:
        try:
            status = overview.drain(res)
        except Exception as exc:
            context["errors"].append(redact(f"The drain's status: {type(exc).__name__}: {exc}"))
            return
        period = overview.beat_period(res.runtime.app)
        ran = status.task_ran_at
        context["drain"] = {
            "last": relative(status.last_pass_at, status.now) if status.last_pass_at else "never",
            "last_exact": when(status.last_pass_at) if status.last_pass_at else "",
            "running": status.running,
            "lock_left": round(status.lock_seconds_left or 0),
            "beat_alive": ran is not None and status.now - ran <= MISSED_PERIODS * period + 5,
            "beat_last": relative(ran, status.now) if ran else "never",
            "period": period,
        }

    def _breaker_part(self, res: Any, context: dict[str, Any]) -> None:
        try:
            states: Counter[str] = Counter(
                str(res.breaker(name).snapshot()["state"]) for name in breaker_names(res)
            )
        except Exception as exc:
            context["errors"].append(redact(f"The breakers: {type(exc).__name__}: {exc}"))
            return
        context["breaker_states"] = sorted(states.items())
        context["breakers_read"] = True
