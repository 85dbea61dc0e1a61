"""Prometheus metrics, read from Redis on each scrape: any one process can serve them.

The counters live in Redis, kept by the same scripts that change the state, so there is no
per-process registry to merge (prefork children would need multiprocess mode otherwise).
Mount :class:`ResilienceCollector` in an existing exporter, or run
``celery -A proj resilience metrics --port 9808``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from .breaker.breaker import Breaker
from .breaker.types import STATES
from .parked.entry import STATUSES
from .parked.store import NO_BREAKER, BackoutStore, Filter


class Source(Protocol):
    """What the metrics read: an app's ``Resilience``, or its runtime."""

    @property
    def backout_store(self) -> BackoutStore: ...

    def breaker(self, name: str) -> Breaker: ...

    def breaker_names(self) -> list[str]: ...


PREFIX = "celery_resilience"
_TRANSITIONS = ("opened", "half_opened", "closed")


def _label(breaker: str) -> str:
    return "" if breaker == NO_BREAKER else breaker


class ResilienceCollector:
    """A ``prometheus_client`` collector over one app's breakers and back-out store."""

    def __init__(self, resilience: Source) -> None:
        self.resilience = resilience

    def describe(self) -> list[Any]:
        return []  # computed on scrape; nothing to check at registration

    def collect(self) -> Iterator[Any]:
        """Read breakers and store from Redis and yield the metric families (one scrape)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        def gauge(name: str, doc: str, labels: list[str]) -> Any:
            return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)

        def counter(name: str, doc: str, labels: list[str]) -> Any:
            return CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)

        res = self.resilience
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
        for name in res.breaker_names():
            snap = res.breaker(name).snapshot()
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
        yield from (state, window_calls, window_failures, consecutive, transitions, calls)
        yield from (rejected, in_flight)
        yield from self._backout()

    def _backout(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        store = self.resilience.backout_store
        entries = GaugeMetricFamily(
            f"{PREFIX}_backout_entries",
            "Entries in the back-out store",
            labels=["breaker", "status"],
        )
        # Known breakers and "no breaker" too, so that an emptied group reads 0, not "no data".
        names = store.breakers() | set(self.resilience.breaker_names()) | {NO_BREAKER}
        for breaker in sorted(names):
            for status in STATUSES:
                entries.add_metric([_label(breaker), status], store.count(Filter(breaker, status)))
        yield entries
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
            "unparkable": CounterMetricFamily(
                f"{PREFIX}_unparkable",
                "Tasks that failed after every park attempt was refused",
                labels=["breaker"],
            ),
        }
        for key, value in sorted(stats.items()):
            kind, _, rest = key.partition("|")
            if kind in families and rest:
                families[kind].add_metric([_label(p) for p in rest.split("|")], value)
        yield from families.values()
        runs = CounterMetricFamily(f"{PREFIX}_drain_runs", "Drain runs that held the lock")
        runs.add_metric([], stats.get("drain_runs", 0.0))
        seconds = CounterMetricFamily(f"{PREFIX}_drain_seconds", "Time spent draining")
        seconds.add_metric([], stats.get("drain_seconds", 0.0))
        yield runs
        yield seconds


def serve(resilience: Source, port: int, addr: str = "127.0.0.1") -> Any:
    """Serve ``/metrics`` for this app on ``addr:port`` in a background thread."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry()
    registry.register(ResilienceCollector(resilience))
    return start_http_server(port, addr=addr, registry=registry)
