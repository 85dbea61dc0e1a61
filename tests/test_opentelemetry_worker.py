"""The ``opentelemetry`` extra across an outage, with a real ``celery worker`` (prefork) on real
Redis: a task parked while its breaker is open, then replayed by a drain, is one story in the
traces. The worker exports its spans to a file as JSON lines (``tests/apps/otelapp.py``); the
drain runs here, exporting to the SDK's ``InMemorySpanExporter``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from celery_resilience.breaker.knowledge import MAX_KNOWLEDGE_AGE
from celery_resilience.contrib.opentelemetry import observe, trace
from celery_resilience.headers import parked_span
from celery_resilience.metrics import ResilienceCollector

from .support.otel_spans import ids, of_task, worker_spans
from .support.waiting import wait_for
from .support.worker_process import WorkerProcess, force_open_for_workers
from .support.worker_world import World

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: Every entry is signed: the span context an entry keeps is under its signature.
SIGNING_KEY = "otel-signing-key-" + "s" * 16


def points(reader: InMemoryMetricReader, name: str) -> dict[tuple[tuple[str, Any], ...], float]:
    """The data points of metric ``name``, by their attributes."""
    data = reader.get_metrics_data()
    found: dict[tuple[tuple[str, Any], ...], float] = {}
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    for point in metric.data.data_points:
                        key = tuple(sorted(dict(point.attributes or {}).items()))
                        found[key] = point.value  # type: ignore[union-attr]
    return found


def prometheus(world: World, name: str) -> dict[tuple[tuple[str, Any], ...], float]:
    """The samples of family ``name`` as the Prometheus collector reads them now."""
    for family in ResilienceCollector(world.resilience.runtime).collect():
        if family.name == name:
            return {tuple(sorted(s.labels.items())): s.value for s in family.samples}
    return {}


def test_a_replay_links_to_the_span_of_the_run_that_parked_it(
    make_world: Callable[..., World], tmp_path: Path
) -> None:
    # Given a prefork worker with tracing on, and this process draining with tracing on
    world = make_world(signing_key=SIGNING_KEY)
    spans_file = tmp_path / "worker-spans.jsonl"
    env = {**world.env, "OTELAPP_SPANS": str(spans_file)}
    worker = WorkerProcess(env, tmp_path / "worker-otel.log", "prefork", 2, "tests.apps.otelapp")
    world.workers.append(worker)
    worker.start()
    drained = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(drained))
    trace(world.app, provider)
    breaker = world.resilience.breaker("dep")

    # When a task arrives while the breaker is open: the worker parks it
    force_open_for_workers(breaker)
    task_id = world.publish("charge", "order-1")
    [entry] = world.wait_parked([task_id]).values()
    assert entry.reason == "breaker_open"
    [park] = wait_for(
        lambda: of_task(worker_spans(spans_file), "resilience.park", task_id), "the park's span"
    )
    [turned_away] = of_task(worker_spans(spans_file), "resilience.admission", task_id)
    assert turned_away["attributes"]["resilience.admitted"] is False
    kept = parked_span(entry.options["headers"])
    assert kept is not None
    trace_id, span_id = ids(park)
    assert kept.startswith(f"00-{trace_id:032x}-{span_id:016x}-")

    # ... the metrics through OpenTelemetry read what the Prometheus collector reads, in Redis
    reader = InMemoryMetricReader()
    observe(world.app, MeterProvider(metric_readers=[reader]))
    by_reason = (("breaker", "dep"), ("reason", "breaker_open"))
    assert points(reader, "celery_resilience_parked") == {by_reason: 1}
    assert prometheus(world, "celery_resilience_parked") == {by_reason: 1}

    # ... and once the dependency is back, a drain replays it and the worker runs it
    world.dependency(up=True)
    breaker.reset()
    time.sleep(MAX_KNOWLEDGE_AGE)  # no worker still believes the breaker open
    report = world.resilience.drain()
    assert report.replayed == 1
    wait_for(lambda: task_id in world.succeeded(), "the replay succeeded")

    # Then the drain's replay span links to the park's span, across processes and the outage
    [replay] = [s for s in drained.get_finished_spans() if s.name == "resilience.replay"]
    assert replay.attributes is not None
    assert replay.attributes["resilience.task_id"] == task_id
    assert [(link.context.trace_id, link.context.span_id) for link in replay.links] == [
        (trace_id, span_id)
    ]
    # ... and so does the replayed run's admission, in the worker
    admitted = wait_for(
        lambda: [
            s
            for s in of_task(worker_spans(spans_file), "resilience.admission", task_id)
            if s["attributes"]["resilience.admitted"]
        ],
        "the replayed run's admission span",
    )
    [linked] = admitted[0]["links"]
    assert (int(linked["context"]["trace_id"], 16), int(linked["context"]["span_id"], 16)) == (
        trace_id,
        span_id,
    )
    replayed = wait_for(
        lambda: points(reader, "celery_resilience_replayed").get((("breaker", "dep"),)),
        "the replay counted in the OpenTelemetry metrics",
    )
    assert replayed == 1
    world.assert_ledger()
