"""The ``opentelemetry`` extra beside OpenTelemetry's own Celery instrumentation
(``opentelemetry-instrumentation-celery``), with a real ``celery worker`` (prefork) on real
Redis: the worker runs both (``tests/apps/otelceleryapp.py``, spans to a file as JSON lines),
and so does this process, which publishes and drains (spans to the SDK's
``InMemorySpanExporter``). What ``docs/tracing.rst`` says of the two together is read off the
spans they really make.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from celery_resilience.breaker.knowledge import MAX_KNOWLEDGE_AGE
from celery_resilience.contrib.opentelemetry import trace

from .support.otel_spans import ids, of_task, worker_spans
from .support.waiting import wait_for
from .support.worker_process import WorkerProcess, force_open_for_workers
from .support.worker_world import World

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# Its release for OpenTelemetry 1.16 (0.37b0) finds its dependencies through pkg_resources, which
# current setuptools no longer has: where it cannot be imported, there is nothing to test.
try:
    from opentelemetry.instrumentation import celery as instrumentation
except ImportError as error:
    pytest.skip(
        f"opentelemetry-instrumentation-celery cannot be imported ({error}): "
        "0.37b0, the release for OpenTelemetry 1.16, needs pkg_resources",
        allow_module_level=True,
    )

#: Every entry is signed: the span context an entry keeps is under its signature.
SIGNING_KEY = "otel-signing-key-" + "s" * 16

# The instrumentor is one instance per process (its class makes it a singleton); its
# constructor carries no annotations.
instrumentor = instrumentation.CeleryInstrumentor()  # type: ignore[no-untyped-call]

TASK = "workerapp.charge"


@pytest.fixture
def drained() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """This process's provider and its exporter, with the Celery instrumentation on."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor.instrument(tracer_provider=provider)
    try:
        yield provider, exporter
    finally:
        instrumentor.uninstrument()


def parent_of(span: dict[str, Any]) -> int | None:
    parent = span.get("parent_id")
    return int(parent, 16) if parent else None


def links_of(span: dict[str, Any]) -> list[tuple[int, int]]:
    return [
        (int(link["context"]["trace_id"], 16), int(link["context"]["span_id"], 16))
        for link in span["links"]
    ]


def by_span_id(spans: list[dict[str, Any]], span_id: int | None) -> dict[str, Any] | None:
    return next((s for s in spans if ids(s)[1] == span_id), None)


def test_the_spans_sit_beside_the_celery_instrumentations(
    make_world: Callable[..., World],
    tmp_path: Path,
    drained: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    # Given a prefork worker with tracing and the Celery instrumentation on, and this process
    # publishing and draining with both on
    provider, exporter = drained
    world = make_world(signing_key=SIGNING_KEY)
    spans_file = tmp_path / "worker-spans.jsonl"
    env = {**world.env, "OTELAPP_SPANS": str(spans_file)}
    worker = WorkerProcess(
        env, tmp_path / "worker-otel.log", "prefork", 2, "tests.apps.otelceleryapp"
    )
    world.workers.append(worker)
    worker.start()
    trace(world.app, provider)
    breaker = world.resilience.breaker("dep")

    # When a task arrives while the breaker is open: the worker parks it
    force_open_for_workers(breaker)
    task_id = world.publish("charge", "order-1")
    world.wait_parked([task_id])
    [park] = wait_for(
        lambda: of_task(worker_spans(spans_file), "resilience.park", task_id), "the park's span"
    )
    [turned_away] = of_task(worker_spans(spans_file), "resilience.admission", task_id)
    parking_run = wait_for(
        lambda: by_span_id(worker_spans(spans_file), parent_of(park)),
        "the span the park's span is a child of",
    )

    # Then in the worker, the admission and the park are children of the instrumentation's run
    assert parking_run["name"] == f"run/{TASK}"
    assert parking_run["kind"] == "SpanKind.CONSUMER"
    assert parent_of(turned_away) == ids(parking_run)[1]
    assert ids(park)[0] == ids(turned_away)[0] == ids(parking_run)[0]

    # When the dependency is back and this process drains
    world.dependency(up=True)
    breaker.reset()
    time.sleep(MAX_KNOWLEDGE_AGE)  # no worker still believes the breaker open
    exporter.clear()  # the first publish's spans
    report = world.resilience.drain()
    assert report.replayed == 1
    wait_for(lambda: task_id in world.succeeded(), "the replay succeeded")

    # Then in the drain, the instrumentation's publish is a child of the replay span, and the
    # replay links to the park
    finished: list[ReadableSpan] = list(exporter.get_finished_spans())
    [replay] = [s for s in finished if s.name == "resilience.replay"]
    assert replay.context is not None
    [publish] = [s for s in finished if s.name == f"apply_async/{TASK}"]
    assert publish.kind == SpanKind.PRODUCER
    assert publish.parent is not None
    assert (publish.parent.trace_id, publish.parent.span_id) == (
        replay.context.trace_id,
        replay.context.span_id,
    )
    assert [(link.context.trace_id, link.context.span_id) for link in replay.links] == [ids(park)]

    # ... and in the worker, the replayed run is in the drain's trace, a child of its publish,
    # and its admission links to the park
    [admitted] = wait_for(
        lambda: [
            s
            for s in of_task(worker_spans(spans_file), "resilience.admission", task_id)
            if s["attributes"]["resilience.admitted"]
        ],
        "the replayed run's admission span",
    )
    replayed_run = wait_for(
        lambda: by_span_id(worker_spans(spans_file), parent_of(admitted)),
        "the span the replayed admission is a child of",
    )
    assert replayed_run["name"] == f"run/{TASK}"
    assert replayed_run["context"]["trace_id"] != parking_run["context"]["trace_id"]
    assert ids(replayed_run)[0] == replay.context.trace_id
    assert publish.context is not None
    assert parent_of(replayed_run) == publish.context.span_id
    assert links_of(admitted) == [ids(park)]
    world.assert_ledger()


def test_a_replay_from_a_drain_without_the_instrumentation_joins_the_first_publishers_trace(
    make_world: Callable[..., World],
    tmp_path: Path,
    drained: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    # Given a prefork worker with tracing and the Celery instrumentation on, and a task this
    # process published with the instrumentation on, parked while its breaker was open
    provider, exporter = drained
    world = make_world(signing_key=SIGNING_KEY)
    spans_file = tmp_path / "worker-spans.jsonl"
    env = {**world.env, "OTELAPP_SPANS": str(spans_file)}
    worker = WorkerProcess(
        env, tmp_path / "worker-otel.log", "prefork", 2, "tests.apps.otelceleryapp"
    )
    world.workers.append(worker)
    worker.start()
    breaker = world.resilience.breaker("dep")
    force_open_for_workers(breaker)
    task_id = world.publish("charge", "order-1")
    world.wait_parked([task_id])
    [first_publish] = [s for s in exporter.get_finished_spans() if s.name == f"apply_async/{TASK}"]
    assert first_publish.context is not None
    [park] = wait_for(
        lambda: of_task(worker_spans(spans_file), "resilience.park", task_id), "the park's span"
    )
    parking_run = wait_for(
        lambda: by_span_id(worker_spans(spans_file), parent_of(park)),
        "the span the park's span is a child of",
    )
    assert parent_of(parking_run) == first_publish.context.span_id

    # When the drain runs with tracing on but without the instrumentation
    instrumentor.uninstrument()
    trace(world.app, provider)
    world.dependency(up=True)
    breaker.reset()
    time.sleep(MAX_KNOWLEDGE_AGE)  # no worker still believes the breaker open
    report = world.resilience.drain()
    assert report.replayed == 1
    wait_for(lambda: task_id in world.succeeded(), "the replay succeeded")

    # Then the replayed run joins the first publisher's trace, under its publish span
    [admitted] = wait_for(
        lambda: [
            s
            for s in of_task(worker_spans(spans_file), "resilience.admission", task_id)
            if s["attributes"]["resilience.admitted"]
        ],
        "the replayed run's admission span",
    )
    replayed_run = wait_for(
        lambda: by_span_id(worker_spans(spans_file), parent_of(admitted)),
        "the span the replayed admission is a child of",
    )
    assert replayed_run["name"] == f"run/{TASK}"
    assert ids(replayed_run)[0] == first_publish.context.trace_id
    assert parent_of(replayed_run) == first_publish.context.span_id
    assert links_of(admitted) == [ids(park)]
    world.assert_ledger()
