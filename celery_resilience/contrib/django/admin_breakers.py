"""The admin page of the app's shared breakers: their state and counts, and the operator's levers.

It reads each breaker through ``Resilience.for_app(app).breaker(name).snapshot()``, the state
every worker shares, and steers it with ``force_open`` / ``force_closed`` / ``reset``, each
behind a confirmation page and logged with the user's name. ``Breaker`` has no table: it only
gives the page its place in the admin index and its permissions (view to look, change to steer).
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from ...backout.store import NO_BREAKER
from ...breaker_listing import is_known, listing
from ...config import BreakerConfig
from ...known_tasks import masking_of
from ...maintenance import LeverAction, Window, pull, start, windows
from ...redact import get_logger, redact
from ...resilience import Resilience
from . import audit
from .admin_messages import RedactedMessages
from .conf import database_store_in_use, resilience
from .display import error, iso, relative, when

logger = get_logger("celery_resilience.admin")
#: Longest maintenance window the force-open form takes (minutes): a week.
MAX_WINDOW_MINUTES = 7 * 24 * 60


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
    """Configured breakers, breakers with state, and breakers that have parked tasks (of the
    derived ones, the troubled first: ``breaker_listing``)."""
    return listing(res.runtime).names


def steer(res: Resilience, name: str, action: LeverAction) -> str:
    """Pull lever ``action`` of breaker ``name`` (ending its maintenance window, in the same
    step); its state afterwards."""
    pull(res.runtime, name, action)
    return str(res.breaker(name).snapshot()["state"])


def _moment(seconds: float | None, now: float, text: str = "") -> dict[str, str]:
    """A time cell: relative to ``now`` (or ``text``), the exact time as its title."""
    if not seconds:
        return {"text": text or "—", "exact": "", "iso": ""}
    return {"text": text or relative(seconds, now), "exact": when(seconds), "iso": iso(seconds)}


def row(
    name: str,
    snap: dict[str, Any],
    now: float,
    limit: int | None = None,
    window: Window | None = None,
) -> dict[str, Any]:
    """One line of the page, times relative to ``now`` (Redis time) with the exact one;
    ``limit`` is the breaker's ``max_concurrent_calls`` (``None``: no bulkhead); ``window`` the
    maintenance window of a breaker forced open from here."""
    state = snap["state"]
    if state == "open":
        until = _moment(snap["open_until"], now)
    elif state == "half_open":  # its timeout has passed: probes go through now
        until = _moment(None, now, "probing now")
    elif state == "forced_open" and window is not None:
        until = _moment(window.until, now, "" if window.until else "until closed")
    elif state == "forced_open":
        until = _moment(None, now, "until closed")
    else:
        until = _moment(None, now)
    if state in ("open", "half_open"):
        opened = _moment(snap["opened_at"], now)
    elif state == "forced_open" and window is not None:
        opened = _moment(window.at, now)
    else:
        opened = _moment(None, now)
    return {
        "name": name,
        "state": state,
        "consecutive_failures": snap["consecutive_failures"],
        "window_calls": snap["window_calls"],
        "window_failures": snap["window_failures"],
        "opened_total": snap["opened_total"],
        "in_flight": "—" if limit is None else f"{snap['calls_in_flight']}/{limit}",
        "opened_at": opened,
        "open_until": until,
        "note": f"{window.note} ({window.by})" if window and window.note else "",
    }


def limits(config: BreakerConfig, snap: dict[str, Any]) -> builtins.list[str]:
    """What a breaker's retry budget and fleet-wide rate limit did, one phrase each (none for
    a breaker without them): the retries they refused are parked tasks, the calls turned away
    tasks that wait in the broker."""
    phrases = []
    if config.retry_budget is not None:
        phrases.append(
            f"retry budget {config.retry_budget:.0%} + {config.min_retries_per_second:g}/s: "
            f"{snap['window_retries']} retries in the window, "
            f"{snap['retry_budget_refused_total']} refused"
        )
    if config.rate_limit is not None:
        phrases.append(
            f"rate limit {config.rate_limit}: {snap['rate_limited_total']} calls turned away"
        )
    return phrases


def holding(window: Window | None, snap: dict[str, Any]) -> Window | None:
    """``window`` if it is what holds the breaker now: a record outlives its hold for a moment
    when a lever drops the hold as a new window is recorded."""
    if window is None or window.id != snap.get("window", ""):
        return None
    return window


def levers_for(state: str) -> builtins.list[Lever]:
    """The levers that change something: no "Force open" on a breaker forced open already."""
    same = {"forced_open": "open", "forced_closed": "close"}.get(state)
    return [lever for lever in LEVERS.values() if lever.action != same]


def parked_counts(res: Resilience) -> dict[str, tuple[int, int]]:
    """Breaker -> (parked, dead) entries, in one read of the store."""
    counts: dict[str, tuple[int, int]] = {}
    for (breaker, status), n in res.backout.store.tally().items():
        parked, dead = counts.get(breaker, (0, 0))
        counts[breaker] = (parked + n, dead) if status == "parked" else (parked, dead + n)
    return counts


def last_error(res: Resilience, name: str) -> str:
    """The newest parked task's error of breaker ``name``, one that is not the breaker's own
    refusal where one of the newest few has it (what the dependency last answered)."""
    newest = res.backout.list(breaker=name, limit=20)
    own = [entry for entry in newest if entry.exc_type and entry.reason != "breaker_open"]
    chosen = own or [entry for entry in newest if entry.exc_type]
    return error(chosen[0], masking_of(res.runtime)) if chosen else ""


class BreakerAdmin(RedactedMessages, admin.ModelAdmin):
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
        rows, problem = [], None
        try:
            res = resilience()
            now, in_database = res.runtime.now(), database_store_in_use()
            counts, notes = parked_counts(res), windows(res.runtime)
            for name in breaker_names(res):
                breaker = res.breaker(name)
                limit = breaker.config.max_concurrent_calls
                snap = breaker.snapshot()
                line = row(name, snap, now, limit, holding(notes.get(name), snap))
                line["limits"] = limits(breaker.config, snap)
                line["parked_url"] = self._parked_url(name, in_database)
                line["parked"], line["dead"] = counts.get(name, (0, 0))
                line["last_error"] = last_error(res, name) if sum(counts.get(name, ())) else ""
                if can_steer:
                    line["levers"] = [
                        (lever.label, self._url("steer", name, lever.action))
                        for lever in levers_for(line["state"])
                    ]
                rows.append(line)
            unbreakered = counts.get(NO_BREAKER, (0, 0))
        except Exception as exc:  # an unreachable Redis or a bad setting: say so on the page
            problem = redact(f"{type(exc).__name__}: {exc}")
            unbreakered = (0, 0)
        context = self._context(
            request,
            "Breakers",
            rows=rows,
            unbreakered=sum(unbreakered),
            # Only where a breaker has a bulkhead: the page keeps to the screen's width.
            any_bulkhead=any(line["in_flight"] != "—" for line in rows),
            any_limits=any(line["limits"] for line in rows),
            error=problem,
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
            if not is_known(res.runtime, name):  # a typo must not make a new breaker
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
                        max_minutes=MAX_WINDOW_MINUTES,
                    ),
                )
            reason = audit.clean_reason(request.POST.get("reason"))
            user = request.user.get_username()
            until = None
            if action == "open":  # a maintenance window: the note, and an end if given
                minutes = _minutes(request.POST.get("minutes"))
                until = None if minutes is None else res.runtime.now() + minutes * 60
                start(res.runtime, name, until, reason, user)
                after = str(res.breaker(name).snapshot()["state"])
            else:
                after = steer(res, name, cast(LeverAction, action))
        except ValueError as exc:  # a bad number of minutes: nothing was changed
            self.message_user(request, str(exc), messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())
        except Exception as exc:  # Redis down: nothing was changed, or we can't tell
            self.message_user(
                request, redact(f"Breaker {name!r}: {type(exc).__name__}: {exc}"), messages.ERROR
            )
            return back
        done = lever.done + (f" until {when(until)}" if until is not None else "")
        logger.warning(
            "Breaker %r %s from the admin by %s (was %s, now %s; reason: %s)",
            name,
            done,
            user,
            before,
            after,
            reason or "none given",
        )
        audit.lever(request, self.model, name, f"{done.capitalize()} (was {before})", reason)
        self.message_user(
            request, f"Breaker “{name}” {done}: now {after} (was {before}).", messages.SUCCESS
        )
        return back


def _minutes(text: str | None) -> int | None:
    """The force-open form's "for N minutes" (empty: until closed by hand)."""
    if not (text or "").strip():
        return None
    try:
        minutes = int(str(text).strip())
    except ValueError:
        raise ValueError(
            f"Minutes must be a whole number, got {text!r}: nothing changed."
        ) from None
    if not 1 <= minutes <= MAX_WINDOW_MINUTES:
        raise ValueError(
            f"Minutes must be between 1 and {MAX_WINDOW_MINUTES}, got {minutes}: nothing changed."
        )
    return minutes
