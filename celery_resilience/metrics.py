"""Prometheus metrics, read from Redis on each scrape: any one process can serve them.

The counters live in Redis, kept by the same scripts that change the state, so there is no
per-process registry to merge (prefork children would need multiprocess mode otherwise).
Mount :class:`ResilienceCollector` in an existing exporter, or run
``celery -A proj resilience metrics --port 9808``.

A scrape never fails because Redis (or the store) is away: ``celery_resilience_up`` reads 0 and
what could not be read is left out, so an alert on ``up == 0`` fires instead of the scrape
turning into an HTTP 500 that looks like a dead exporter.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import redis

from .backout.entry import STATUSES
from .backout.store import NO_BREAKER, BackoutStore, Filter
from .backout.trust import HELD_CODES
from .breaker.types import STATES
from .breaker_listing import Listing, listing
from .drain.status import last_drained, task_last_ran
from .errors import ResilienceError
from .redact import get_logger
from .runtime import Runtime

logger = get_logger("celery_resilience.metrics")


class Facade(Protocol):
    """An app's ``Resilience``: the metrics read its runtime."""

    @property
    def runtime(self) -> Runtime: ...


PREFIX = "celery_resilience"
_TRANSITIONS = ("opened", "half_opened", "closed")
_BY_REASON = ["breaker", "reason"]


def _tally(store: BackoutStore) -> dict[tuple[str, str], int]:
    """Entries per (breaker, status) in one read; a store without ``tally`` is asked per
    breaker."""
    tally = getattr(store, "tally", None)
    if tally is not None:
        return dict(tally())
    return {
        (breaker, status): store.count(Filter(breaker, status))
        for breaker in store.breakers()
        for status in STATUSES
    }


def _label(breaker: str) -> str:
    return "" if breaker == NO_BREAKER else breaker


class ResilienceCollector:
    """A ``prometheus_client`` collector over one app's breakers and back-out store."""

    def __init__(self, resilience: Facade | Runtime) -> None:
        self.runtime = resilience if isinstance(resilience, Runtime) else resilience.runtime

    def describe(self) -> list[Any]:
        return []  # computed on scrape; nothing to check at registration

    def collect(self) -> Iterator[Any]:
        """Read breakers and store and yield the metric families (one scrape); a part that
        can't be read is left out and ``celery_resilience_up`` says 0."""
        from prometheus_client.core import GaugeMetricFamily

        runtime = self.runtime
        families: list[Any] = []
        up = 1.0
        try:  # part by part: what was read before a failure is served
            shown = listing(runtime)
            families += self._breakers(shown)
            families += self._backout(runtime, shown.names)
            families += self._ages(runtime)
            families += self._held(runtime)
        except (ResilienceError, redis.RedisError) as exc:
            up = 0.0
            logger.warning("Metrics: %s", exc)
        gauge = GaugeMetricFamily(
            f"{PREFIX}_up",
            "1 when the breakers and the back-out store could be read at this scrape, else 0",
        )
        gauge.add_metric([], up)
        yield gauge
        yield from families

    def _ages(self, runtime: Runtime) -> list[Any]:
        """How long the oldest parked task has waited, and when a drain last did its work."""
        from prometheus_client.core import GaugeMetricFamily

        store = runtime.backout_store
        found: list[Any] = []
        oldest_of = getattr(store, "oldest_parked", None)
        oldest = oldest_of() if oldest_of is not None else None
        age = GaugeMetricFamily(
            f"{PREFIX}_oldest_parked_age_seconds",
            "Seconds the oldest parked task (not dead) has waited in the store; 0 when none",
        )
        age.add_metric([], 0.0 if oldest is None else max(0.0, runtime.now() - oldest))
        found.append(age)
        drained = GaugeMetricFamily(
            f"{PREFIX}_last_drain_timestamp_seconds",
            "When a drain last finished a pass without errors (Unix time); no sample before one",
        )
        last = last_drained(runtime)
        if last is not None:  # never drained: no sample, rather than a 1970 timestamp
            drained.add_metric([], last)
        found.append(drained)
        beat = GaugeMetricFamily(
            f"{PREFIX}_drain_task_last_run_timestamp_seconds",
            "When the celery_resilience.drain task (sent by beat) last ran (Unix time); no "
            "sample when it has not run for a week",
        )
        ran = task_last_ran(runtime)
        if ran is not None:
            beat.add_metric([], ran)
        found.append(beat)
        return found

    def _held(self, runtime: Runtime) -> list[Any]:
        """Entries drains leave parked for a process that can read them, by reason: how many,
        and how long the oldest has waited (0 for a reason with none, rather than no data)."""
        from prometheus_client.core import GaugeMetricFamily

        held = runtime.backout_store.held_entries()
        count = GaugeMetricFamily(
            f"{PREFIX}_held_entries",
            "Entries drains leave parked for a process that can read them, by reason "
            "(unknown_key: a key the drainer lacks; newer_format: a newer release's)",
            labels=["reason"],
        )
        age = GaugeMetricFamily(
            f"{PREFIX}_oldest_held_age_seconds",
            "Seconds since the oldest held entry was parked, by reason; 0 when none is held",
            labels=["reason"],
        )
        now = runtime.now() if held else 0.0
        for code in sorted({*HELD_CODES, *held}):
            number, oldest = held.get(code, (0, now))
            count.add_metric([code], float(number))
            age.add_metric([code], max(0.0, now - oldest) if number else 0.0)
        return [count, age]

    def _breakers(self, shown: Listing) -> list[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        runtime = self.runtime

        def gauge(name: str, doc: str, labels: list[str]) -> Any:
            return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)

        def counter(name: str, doc: str, labels: list[str]) -> Any:
            return CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)

        state = gauge("breaker_state", "1 for the state the breaker is in", ["breaker", "state"])
        window_calls = gauge("breaker_window_calls", "Calls in the sliding window", ["breaker"])
        window_failures = gauge(
            "breaker_window_failures", "Failures in the sliding window", ["breaker"]
        )
        consecutive = gauge(
            "breaker_consecutive_failures", "Failures since the last success", ["breaker"]
        )
        transitions = counter("breaker_transitions", "Transitions made", ["breaker", "transition"])
        calls = counter("breaker_calls", "Recorded calls by outcome", ["breaker", "outcome"])
        rejected = counter(
            "breaker_rejected_calls", "Calls the breaker rejected", ["breaker", "reason"]
        )
        in_flight = gauge(
            "breaker_calls_in_flight", "Calls holding a bulkhead slot, fleet-wide", ["breaker"]
        )
        window_retries = gauge(
            "breaker_window_retries", "Retries the retry budget granted in the window", ["breaker"]
        )
        refused = counter(
            "breaker_retries_refused",
            "Retries over the retry budget, parked (reason retry_budget)",
            ["breaker"],
        )
        limited = counter(
            "breaker_rate_limited",
            "Calls over the breaker's rate_limit, turned away (a task waits in the broker)",
            ["breaker"],
        )
        derived = gauge(
            "derived_breakers",
            "Breakers named at call time, per family: with state, troubled, not shown one by one",
            ["breaker", "kind"],
        )
        for base, family in shown.families.items():
            derived.add_metric([base, "members"], family.members)
            derived.add_metric([base, "troubled"], family.troubled)
            derived.add_metric([base, "hidden"], family.hidden)
        for name in shown.names:
            snap = runtime.breaker(name).snapshot()
            for each in STATES:
                state.add_metric([name, each], 1.0 if snap["state"] == each else 0.0)
            window_calls.add_metric([name], snap["window_calls"])
            window_failures.add_metric([name], snap["window_failures"])
            consecutive.add_metric([name], snap["consecutive_failures"])
            for transition in _TRANSITIONS:
                transitions.add_metric([name, transition], snap[f"{transition}_total"])
            calls.add_metric([name, "success"], snap["successes_total"])
            calls.add_metric([name, "failure"], snap["failures_total"])
            # A full bulkhead is a rejection of its own: the dependency was not judged down.
            full = snap["bulkhead_rejected_total"]
            rejected.add_metric([name, "breaker_open"], snap["rejected_total"] - full)
            rejected.add_metric([name, "bulkhead_full"], full)
            in_flight.add_metric([name], snap["calls_in_flight"])
            window_retries.add_metric([name], snap["window_retries"])
            refused.add_metric([name], snap["retry_budget_refused_total"])
            limited.add_metric([name], snap["rate_limited_total"])
        gauges = [state, window_calls, window_failures, consecutive, in_flight, window_retries]
        return [*gauges, derived, transitions, calls, rejected, refused, limited]

    def _backout(self, runtime: Runtime, shown: list[str]) -> list[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        store = runtime.backout_store
        entries = GaugeMetricFamily(
            f"{PREFIX}_backout_entries",
            "Entries in the back-out store",
            labels=["breaker", "status"],
        )
        # Shown breakers and "no breaker" too, so that an emptied group reads 0, not "no data";
        # the derived breakers not shown are summed under "<base>:*".
        folded: dict[tuple[str, str], float] = {}
        for breaker in (*shown, NO_BREAKER):
            for known in STATUSES:
                folded[_label(breaker), known] = 0.0
        for (breaker, which), n in _tally(store).items():
            base = runtime.config.family_of(breaker)
            label = _label(breaker) if base is None or breaker in shown else f"{base}:*"
            folded[label, which] = folded.get((label, which), 0.0) + n
        for (label, each), number in sorted(folded.items()):
            entries.add_metric([label, each], number)
        found: list[Any] = [entries]
        stats = store.stats()
        families = {
            "parked": CounterMetricFamily(
                f"{PREFIX}_parked", "Tasks parked", labels=["breaker", "reason"]
            ),
            "replayed": CounterMetricFamily(
                f"{PREFIX}_replayed", "Parked tasks published again", labels=["breaker"]
            ),
            "dead": CounterMetricFamily(
                f"{PREFIX}_dead", "Entries that became dead in a drain", labels=["breaker"]
            ),
            "dead_reason": CounterMetricFamily(
                f"{PREFIX}_dead_by_reason",
                "Entries that became dead in a drain, by dead reason (tampered, unsigned...)",
                labels=["breaker", "reason"],
            ),
            "retries": CounterMetricFamily(
                f"{PREFIX}_retries_scheduled", "Retries scheduled with backoff", labels=["breaker"]
            ),
            "fallbacks": CounterMetricFamily(
                f"{PREFIX}_breaker_fallbacks", "Refused calls that fell back", labels=_BY_REASON
            ),
            "unparkable": CounterMetricFamily(
                f"{PREFIX}_unparkable",
                "Tasks that failed after every park attempt was refused",
                labels=["breaker"],
            ),
        }
        # Counters of derived breakers are summed per family under "<base>:*" (a counter must
        # not move between labels as breakers come and go among those shown).
        counted: dict[tuple[str, ...], float] = {}
        for key, value in sorted(stats.items()):
            kind, _, rest = key.partition("|")
            if kind in families and rest:
                labels = [_label(p) for p in rest.split("|")]
                base = runtime.config.family_of(labels[0])
                if base is not None:
                    labels[0] = f"{base}:*"
                series = (kind, *labels)
                counted[series] = counted.get(series, 0.0) + value
        for series, total in counted.items():
            families[series[0]].add_metric(list(series[1:]), total)
        found += families.values()
        runs = CounterMetricFamily(f"{PREFIX}_drain_runs", "Drain runs that held the lock")
        runs.add_metric([], stats.get("drain_runs", 0.0))
        seconds = CounterMetricFamily(f"{PREFIX}_drain_seconds", "Time spent draining")
        seconds.add_metric([], stats.get("drain_seconds", 0.0))
        return [*found, runs, seconds]


def serve(resilience: Facade | Runtime, port: int, addr: str = "127.0.0.1") -> Any:
    """Serve ``/metrics`` and ``/healthz`` for this app on ``addr:port`` in a background thread
    (see :mod:`celery_resilience.metrics_server`); returns the server and its thread."""
    from prometheus_client import CollectorRegistry, make_wsgi_app

    from .metrics_server import serve as serve_http

    runtime = resilience if isinstance(resilience, Runtime) else resilience.runtime
    registry = CollectorRegistry()
    registry.register(ResilienceCollector(runtime))
    return serve_http(runtime, make_wsgi_app(registry), port, addr)
