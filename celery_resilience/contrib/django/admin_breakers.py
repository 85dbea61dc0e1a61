"""The admin page of the app's shared breakers: their state and counts, and the operator's levers.

It reads each breaker through ``Resilience.for_app(app).breaker(name).snapshot()``, the state
every worker shares, and steers it with ``force_open`` / ``force_closed`` / ``reset``, each
behind a confirmation page and logged with the user's name. ``Breaker`` has no table: it only
gives the page its place in the admin index and its permissions (view to look, change to steer).
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from ...parked.store import NO_BREAKER
from ...redact import get_logger, redact
from ...resilience import Resilience
from .admin_messages import RedactedMessages
from .conf import database_store_in_use, resilience
from .display import iso, relative, when

logger = get_logger("celery_resilience.admin")
#: States whose ``open_until`` means something: when an open breaker lets a probe through.
TIMED = ("open", "half_open")


@dataclass(frozen=True)
class Lever:
    """One way to steer a breaker: the URL's word, the button, and what it does to calls."""

    action: str
    label: str
    done: str
    effect: str


LEVERS = {
    lever.action: lever
    for lever in (
        Lever(
            "open",
            "Force open",
            "forced open",
            "Every call through it is rejected (tasks are parked) until it is forced closed "
            "or reset.",
        ),
        Lever(
            "close",
            "Force closed",
            "forced closed",
            "Every call is admitted and no failure trips it until it is reset.",
        ),
        Lever(
            "reset",
            "Reset",
            "reset",
            "It becomes a fresh closed breaker: its counts start again (the totals are kept).",
        ),
    )
}


def breaker_names(res: Resilience) -> builtins.list[str]:
    """Configured breakers, breakers with state, and breakers that have parked tasks."""
    return sorted(set(res.breaker_names()) | (res.backout_store.breakers() - {NO_BREAKER}))


def steer(res: Resilience, name: str, action: str) -> str:
    """Pull lever ``action`` of breaker ``name``; its state afterwards."""
    breaker = res.breaker(name)
    {"open": breaker.force_open, "close": breaker.force_closed, "reset": breaker.reset}[action]()
    return str(breaker.snapshot()["state"])


def row(name: str, snap: dict[str, Any], now: float, limit: int | None = None) -> dict[str, Any]:
    """One line of the page, times relative to ``now`` (Redis time) with the exact one;
    ``limit`` is the breaker's ``max_concurrent_calls`` (``None``: no bulkhead)."""
    timed = snap["state"] in TIMED
    return {
        "name": name,
        "state": snap["state"],
        "consecutive_failures": snap["consecutive_failures"],
        "window_calls": snap["window_calls"],
        "window_failures": snap["window_failures"],
        "opened_total": snap["opened_total"],
        "in_flight": "—" if limit is None else f"{snap['calls_in_flight']}/{limit}",
        "open_until": relative(snap["open_until"], now) if timed else "—",
        "open_until_exact": when(snap["open_until"]) if timed else "",
        "open_until_iso": iso(snap["open_until"]) if timed else "",
    }


class BreakerAdmin(RedactedMessages, admin.ModelAdmin):  # type: ignore[misc]  # Django is untyped here
    """The breakers' list and the confirmation page of each lever."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> builtins.list[Any]:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        view = self.admin_site.admin_view
        return [
            path("", view(self.changelist_view), name=f"{prefix}_changelist"),
            # ``path``: a breaker's name may hold a slash; the action is the last part.
            path("<path:name>/<str:action>/", view(self.steer_view), name=f"{prefix}_steer"),
        ]

    def _url(self, name: str, *args: str) -> str:
        opts = self.opts
        return str(
            reverse(f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_{name}", args=args)
        )

    def _parked_url(self, name: str, in_database: bool) -> str:
        """The list of the breaker's parked tasks, on whichever page shows the app's store."""
        if in_database:
            page, query = "parkedtaskrecord", {"breaker__exact": name}
        else:
            page, query = "storeentry", {"breaker": name}
        url = reverse(f"{self.admin_site.name}:{self.opts.app_label}_{page}_changelist")
        return f"{url}?{urlencode(query)}"

    def _context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": title,
            "changelist_url": self._url("changelist"),
            **extra,
        }

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        can_steer = self.has_change_permission(request)
        rows, error = [], None
        try:
            res = resilience()
            now, in_database = res.now(), database_store_in_use()
            for name in breaker_names(res):
                breaker = res.breaker(name)
                line = row(name, breaker.snapshot(), now, breaker.config.max_concurrent_calls)
                line["parked_url"] = self._parked_url(name, in_database)
                if can_steer:
                    line["levers"] = [
                        (lever.label, self._url("steer", name, lever.action))
                        for lever in LEVERS.values()
                    ]
                rows.append(line)
        except Exception as exc:  # an unreachable Redis or a bad setting: say so on the page
            error = redact(f"{type(exc).__name__}: {exc}")
        context = self._context(
            request,
            "Breakers",
            rows=rows,
            # Only where a breaker has a bulkhead: the page keeps to the screen's width.
            any_bulkhead=any(line["in_flight"] != "—" for line in rows),
            error=error,
            can_steer=can_steer,
            **(extra_context or {}),
        )
        return TemplateResponse(request, "admin/celery_resilience/breaker_list.html", context)

    def steer_view(self, request: HttpRequest, name: str, action: str) -> HttpResponse:
        """GET: what the lever will do, and a button; POST: pull it, log who did, report."""
        if not self.has_change_permission(request):
            raise PermissionDenied
        back = HttpResponseRedirect(self._url("changelist"))
        lever = LEVERS.get(action)
        if lever is None:
            self.message_user(request, f"Unknown action {action!r}.", messages.ERROR)
            return back
        try:
            res = resilience()
            if name not in breaker_names(res):  # a typo must not make a new breaker
                self.message_user(request, f"Unknown breaker {name!r}.", messages.ERROR)
                return back
            before = str(res.breaker(name).snapshot()["state"])
            if request.method != "POST":
                return TemplateResponse(
                    request,
                    "admin/celery_resilience/breaker_confirm.html",
                    self._context(
                        request,
                        f"{lever.label} breaker “{name}”?",
                        name=name,
                        lever=lever,
                        state=before,
                    ),
                )
            after = steer(res, name, action)
        except Exception as exc:  # Redis down: nothing was changed, or we can't tell
            self.message_user(
                request, redact(f"Breaker {name!r}: {type(exc).__name__}: {exc}"), messages.ERROR
            )
            return back
        user = request.user.get_username()
        logger.warning(
            "Breaker %r %s from the admin by %s (was %s, now %s)",
            name,
            lever.done,
            user,
            before,
            after,
        )
        self.message_user(
            request, f"Breaker “{name}” {lever.done}: now {after} (was {before}).", messages.SUCCESS
        )
        return back
