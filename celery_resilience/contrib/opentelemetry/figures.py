"""The package's metrics through OpenTelemetry's metrics API, beside the Prometheus exporter.

Observable instruments, one per metric family of
:class:`celery_resilience.metrics.ResilienceCollector`, with its names, descriptions and units
(seconds where the name ends so): their callbacks read what that collector reads, from Redis, at
each collection; one read serves every instrument of a collection. As with the Prometheus
exporter, one process is enough (the figures are the fleet's, in Redis): call :func:`observe`
where the app's metrics should come from, not in every worker.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry import metrics as api
from opentelemetry.metrics import CallbackOptions, Observation

from ... import __version__
from ...config import MEMORY_URL
from ...metrics import ResilienceCollector
from ...runtime import Runtime

#: The instrumentation scope of the package's instruments.
SCOPE = "celery_resilience"
#: Seconds one read of the figures serves the callbacks of a collection.
FRESH_FOR = 1.0


def observe(target: Any, meter_provider: Any = None) -> Figures:
    """Report an app's (or its :class:`Runtime`'s) metrics through ``meter_provider``
    (default: the global one); the figures read at each collection."""
    runtime = target if isinstance(target, Runtime) else Runtime.for_app(target)
    figures = Figures(ResilienceCollector(runtime))
    meter = api.get_meter(SCOPE, __version__, meter_provider)
    for family in families_of(runtime):
        unit = "s" if family.name.endswith("_seconds") else ""
        callbacks = [figures.callback(family.name)]
        if family.type == "counter":
            meter.create_observable_counter(family.name, callbacks, unit, family.documentation)
        else:
            meter.create_observable_gauge(family.name, callbacks, unit, family.documentation)
    return figures


def families_of(runtime: Runtime) -> list[Any]:
    """Every metric family the collector yields, asked of an empty store in memory: the
    instruments exist from the start, whether or not Redis can be read then."""
    config = dataclasses.replace(runtime.config, redis_url=MEMORY_URL, tracing=False)
    empty = Runtime(runtime.app, config)
    try:
        return list(ResilienceCollector(empty).collect())
    finally:
        empty.close()


class Figures:
    """The collector's figures, read once for the callbacks of one collection."""

    def __init__(self, collector: ResilienceCollector) -> None:
        self.collector = collector
        self._lock = threading.Lock()
        self._read_at = -FRESH_FOR
        self._samples: dict[str, list[Observation]] = {}
        self._pid = os.getpid()

    def callback(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        """The callback of the instrument of family ``name``."""

        def observations(options: CallbackOptions) -> Iterable[Observation]:
            return self.of(name)

        return observations

    def of(self, name: str) -> list[Observation]:
        """The samples of family ``name`` now (none when they could not be read, and none in a
        process forked from the one that called :func:`observe`: a prefork worker's children
        would each report the fleet's figures again)."""
        if os.getpid() != self._pid:
            return []
        with self._lock:
            if time.monotonic() - self._read_at >= FRESH_FOR:
                try:
                    self._samples = samples(self.collector.collect())
                except Exception:  # nothing stale is reported as now
                    self._samples = {}
                    raise
                finally:  # a failed read too serves the collection's other instruments
                    self._read_at = time.monotonic()
            return self._samples.get(name, [])


def samples(families: Iterable[Any]) -> dict[str, list[Observation]]:
    """The observations of each family, by its name (a counter's value sample only: the
    ``_total`` one, not ``_created``)."""
    found: dict[str, list[Observation]] = {}
    for family in families:
        wanted = f"{family.name}_total" if family.type == "counter" else family.name
        found[family.name] = [
            Observation(sample.value, dict(sample.labels))
            for sample in family.samples
            if sample.name == wanted
        ]
    return found
