"""The ``opentelemetry`` extra in one process: spans, span events and metrics read with the SDK's
in-memory exporters, around eager tasks on the in-memory stores (no socket, no process).

Each test makes its own ``TracerProvider``/``MeterProvider`` and hands it to the extra
(``trace(app, provider)``, ``observe(app, provider)``): the global providers are left alone.
"""

from __future__ import annotations

import importlib.util
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext
from prometheus_client.core import Metric

from celery_resilience import ConfigurationError, Resilience, ResilientTask
from celery_resilience.backout.codec import Codec
from celery_resilience.backout.trust import Untrusted
from celery_resilience.contrib.opentelemetry import OpenTelemetryTracing, observe, trace
from celery_resilience.contrib.opentelemetry import spans as spans_module
from celery_resilience.contrib.opentelemetry.spans import links, traceparent
from celery_resilience.headers import PARKED_SPAN_HEADER, parked_span
from celery_resilience.metrics import ResilienceCollector
from celery_resilience.runtime import Runtime, installed

pytestmark = pytest.mark.unit

BREAKERS = {"dep": {"failure_threshold": 1, "open_timeout": 30.0}}


class DependencyDown(ConnectionError):
    """Transient: the dependency did not answer."""


@pytest.fixture
def make_app() -> Iterator[Callable[..., Celery]]:
    """An eager app on the in-memory stores; ``**settings`` go to ``app.conf``."""
    made: list[Celery] = []

    def make(**settings: Any) -> Celery:
        app = Celery(f"otel-{uuid.uuid4().hex[:8]}", broker="memory://", set_as_current=False)
        app.conf.update(
            task_always_eager=True,
            task_eager_propagates=False,
            resilience_redis_url="memory://",
            resilience_breakers=BREAKERS,
            **settings,
        )
        made.append(app)
        return app

    yield make
    for app in made:
        runtime = installed(app)
        if runtime is not None:
            runtime.close()


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    made = TracerProvider()
    made.add_span_processor(SimpleSpanProcessor(exporter))
    return made


def charge_task(app: Celery, up: dict[str, bool]) -> Any:
    def charge(self: Any, order_id: int) -> int:
        if not up["dep"]:
            raise DependencyDown("gateway down")
        return order_id

    return app.task(
        base=ResilientTask,
        bind=True,
        shared=False,
        lazy=False,
        name="otel.charge",
        breaker="dep",
        retry_on=(DependencyDown,),
        max_retries=0,
    )(charge)


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


# -- the setting -------------------------------------------------------------------------------
def test_tracing_is_off_unless_turned_on(make_app: Callable[..., Celery]) -> None:
    runtime = Resilience.for_app(make_app()).runtime
    assert runtime.config.tracing is False
    assert runtime.tracing is None


def test_the_setting_turns_the_spans_on(make_app: Callable[..., Celery]) -> None:
    runtime = Resilience.for_app(make_app(resilience_tracing=True)).runtime
    assert isinstance(runtime.tracing, OpenTelemetryTracing)


def test_a_setting_that_is_not_a_bool_is_refused_by_name(make_app: Callable[..., Celery]) -> None:
    with pytest.raises(ConfigurationError, match="resilience_tracing must be True or False"):
        Resilience.for_app(make_app(resilience_tracing="yes"))


def test_tracing_without_the_extra_is_refused_by_name(
    make_app: Callable[..., Celery], monkeypatch: pytest.MonkeyPatch
) -> None:
    found = importlib.util.find_spec

    def without_opentelemetry(name: str, *args: Any) -> Any:
        # As where only another opentelemetry-* distribution makes the namespace importable.
        return None if name == "opentelemetry.trace" else found(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_opentelemetry)
    with pytest.raises(ConfigurationError, match=r"resilience_tracing .*opentelemetry extra"):
        Resilience.for_app(make_app(resilience_tracing=True))


# -- spans -------------------------------------------------------------------------------------
def test_a_task_turned_away_by_an_open_breaker_is_admitted_no_and_parked_in_a_span(
    make_app: Callable[..., Celery], spans: InMemorySpanExporter
) -> None:
    app = make_app()
    trace(app, provider(spans))
    charge = charge_task(app, {"dep": True})
    Resilience.for_app(app).breaker("dep").force_open()

    result = charge.apply(args=(7,))

    [admission] = named(spans, "resilience.admission")
    assert admission.attributes is not None
    assert admission.attributes["resilience.admitted"] is False
    assert admission.attributes["resilience.rejected"] == "BreakerOpen"
    assert admission.attributes["resilience.task_id"] == result.id
    [park] = named(spans, "resilience.park")
    [entry] = Resilience.for_app(app).backout.list()
    assert park.attributes is not None
    assert park.attributes["resilience.reason"] == "breaker_open"
    assert park.attributes["resilience.entry_id"] == entry.id
    # The entry keeps the park's span context, for its replay to link to.
    assert park.context is not None
    kept = parked_span(entry.options["headers"])
    assert kept is not None
    assert kept.startswith(f"00-{park.context.trace_id:032x}-{park.context.span_id:016x}-")


def test_a_closed_breaker_admits_in_a_span_and_parks_nothing(
    make_app: Callable[..., Celery], spans: InMemorySpanExporter
) -> None:
    app = make_app()
    trace(app, provider(spans))
    charge = charge_task(app, {"dep": True})

    assert charge.apply(args=(7,)).get() == 7

    [admission] = named(spans, "resilience.admission")
    assert admission.attributes is not None
    assert admission.attributes["resilience.admitted"] is True
    assert admission.attributes["resilience.breaker"] == "dep"
    assert named(spans, "resilience.park") == []


def test_a_failure_that_trips_the_breaker_is_an_event_on_the_current_span(
    make_app: Callable[..., Celery], spans: InMemorySpanExporter
) -> None:
    app = make_app()
    tracing = trace(app, provider(spans))
    charge = charge_task(app, {"dep": False})

    # The span the Celery instrumentation would make current around the run.
    with tracing.tracer.start_as_current_span("run/otel.charge"):
        charge.apply(args=(7,))

    [run] = named(spans, "run/otel.charge")
    events = [e for e in run.events if e.name == "resilience.breaker.opened"]
    assert len(events) == 1
    assert events[0].attributes is not None
    assert events[0].attributes["resilience.breaker"] == "dep"
    assert events[0].attributes["resilience.breaker.state"] == "open"
    # The park that followed (retries exhausted) sits under the same run.
    [park] = named(spans, "resilience.park")
    assert park.parent is not None
    assert run.context is not None
    assert park.parent.span_id == run.context.span_id


def test_a_replay_links_to_the_span_that_parked_it(
    make_app: Callable[..., Celery], spans: InMemorySpanExporter
) -> None:
    app = make_app()
    trace(app, provider(spans))
    up = {"dep": True}
    charge = charge_task(app, up)
    breaker = Resilience.for_app(app).breaker("dep")
    breaker.force_open()
    charge.apply(args=(7,))
    [park] = named(spans, "resilience.park")
    breaker.reset()

    report = Resilience.for_app(app).drain()

    assert report.replayed == 1
    [replay] = named(spans, "resilience.replay")
    assert park.context is not None
    assert [link.context.span_id for link in replay.links] == [park.context.span_id]
    assert replay.links[0].context.trace_id == park.context.trace_id
    [drain] = named(spans, "resilience.drain")
    assert drain.attributes is not None
    assert drain.attributes["resilience.drain.kind"] == "run"
    assert drain.attributes["resilience.drain.replayed"] == 1
    assert replay.parent is not None
    assert drain.context is not None
    assert replay.parent.span_id == drain.context.span_id
    # The replayed run (eager: at once) is admitted, linked to the park too.
    admissions = named(spans, "resilience.admission")
    assert [a.attributes and a.attributes["resilience.admitted"] for a in admissions] == [
        False,
        True,
    ]
    assert [link.context.span_id for link in admissions[1].links] == [park.context.span_id]


def test_beats_drain_pass_is_a_span_of_kind_pass(
    make_app: Callable[..., Celery], spans: InMemorySpanExporter
) -> None:
    app = make_app()
    trace(app, provider(spans))

    Resilience.for_app(app).drain_once()

    [drain] = named(spans, "resilience.drain")
    assert drain.attributes is not None
    assert drain.attributes["resilience.drain.kind"] == "pass"
    assert drain.attributes["resilience.drain.replayed"] == 0


def test_an_entry_parked_without_a_span_replays_unlinked(
    make_app: Callable[..., Celery], spans: InMemorySpanExporter
) -> None:
    app = make_app()
    charge = charge_task(app, {"dep": True})
    breaker = Resilience.for_app(app).breaker("dep")
    breaker.force_open()
    charge.apply(args=(7,))  # parked while tracing is off: no span kept
    [entry] = Resilience.for_app(app).backout.list()
    assert PARKED_SPAN_HEADER not in entry.options.get("headers", {})
    breaker.reset()
    trace(app, provider(spans))

    assert Resilience.for_app(app).drain().replayed == 1

    [replay] = named(spans, "resilience.replay")
    assert replay.links == ()


def test_the_kept_span_is_covered_by_the_entry_signature(
    make_app: Callable[..., Celery], spans: InMemorySpanExporter
) -> None:
    app = make_app(resilience_signing_key="k" * 32)
    trace(app, provider(spans))
    charge_task(app, {"dep": True})
    Resilience.for_app(app).breaker("dep").force_open()
    app.tasks["otel.charge"].apply(args=(7,))
    [entry] = Resilience.for_app(app).backout.list()
    kept = parked_span(entry.options["headers"])
    assert kept is not None
    codec = Codec("json", ["k" * 32])
    data = codec.encode(entry)
    assert codec.decode(data, entry.id).options == entry.options

    other = kept[:-2] + ("00" if kept.endswith("01") else "01")
    with pytest.raises(Untrusted, match="signature"):
        codec.decode(data.replace(kept.encode(), other.encode()), entry.id)


# -- tracing that fails ------------------------------------------------------------------------
class Failing(SpanProcessor):
    """A span processor that raises as a span of one name starts or ends (an exporter that
    fails, a bug in a processor)."""

    def __init__(self, name: str, at: str) -> None:
        self.name, self.at = name, at

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.at == "start" and span.name == self.name:
            raise RuntimeError(f"processor fails as {self.name} starts")

    def on_end(self, span: ReadableSpan) -> None:
        if self.at == "end" and span.name == self.name:
            raise RuntimeError(f"processor fails as {self.name} ends")


def failing(name: str, at: str) -> TracerProvider:
    made = TracerProvider()
    made.add_span_processor(Failing(name, at))
    return made


@pytest.fixture
def tracing_log(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> pytest.LogCaptureFixture:
    """The warnings of tracing's own errors, each kind logged afresh for this test."""
    monkeypatch.setattr(spans_module, "_REPORTED", set())
    caplog.set_level("WARNING", logger="celery_resilience.tracing")
    return caplog


def counting_task(app: Celery, runs: list[int]) -> Any:
    def charge(order_id: int) -> int:
        runs.append(order_id)
        return order_id

    return app.task(
        base=ResilientTask, shared=False, lazy=False, name="otel.counted", breaker="dep"
    )(charge)


AT = pytest.mark.parametrize("at", ["start", "end"])


@AT
def test_a_park_whose_span_fails_is_stored_once_and_kept_nowhere_else(
    make_app: Callable[..., Celery], tracing_log: pytest.LogCaptureFixture, at: str
) -> None:
    app = make_app()
    trace(app, failing("resilience.park", at))
    runs: list[int] = []
    counted = counting_task(app, runs)
    Resilience.for_app(app).breaker("dep").force_open()

    counted.apply(args=(7,))

    assert len(Resilience.for_app(app).backout.list()) == 1
    assert "kept in the broker" not in tracing_log.text
    assert runs == []
    assert [r.message for r in tracing_log.records if r.name == "celery_resilience.tracing"] == [
        f"Tracing could not {at} a resilience.park span (RuntimeError: processor fails as "
        f"resilience.park {at}s): the step goes on without it"
    ]


@AT
def test_a_replay_whose_span_fails_is_published_once_and_acked(
    make_app: Callable[..., Celery], tracing_log: pytest.LogCaptureFixture, at: str
) -> None:
    app = make_app()
    runs: list[int] = []
    counted = counting_task(app, runs)
    breaker = Resilience.for_app(app).breaker("dep")
    breaker.force_open()
    counted.apply(args=(7,))
    breaker.reset()
    trace(app, failing("resilience.replay", at))

    report = Resilience.for_app(app).drain()

    assert (report.replayed, report.dead) == (1, 0)
    assert runs == [7]  # eager: the replay ran at its publish, once
    assert Resilience.for_app(app).backout.list() == []
    assert "Tracing could not" in tracing_log.text


@AT
def test_an_admission_whose_span_fails_runs_the_body(
    make_app: Callable[..., Celery], tracing_log: pytest.LogCaptureFixture, at: str
) -> None:
    app = make_app()
    trace(app, failing("resilience.admission", at))
    runs: list[int] = []
    counted = counting_task(app, runs)

    assert counted.apply(args=(7,)).get() == 7

    assert runs == [7]
    assert Resilience.for_app(app).backout.list() == []
    assert "Tracing could not" in tracing_log.text


@AT
def test_a_drain_whose_span_fails_reports_what_it_did(
    make_app: Callable[..., Celery], tracing_log: pytest.LogCaptureFixture, at: str
) -> None:
    app = make_app()
    runs: list[int] = []
    counted = counting_task(app, runs)
    breaker = Resilience.for_app(app).breaker("dep")
    breaker.force_open()
    counted.apply(args=(7,))
    breaker.reset()
    trace(app, failing("resilience.drain", at))

    assert Resilience.for_app(app).drain().replayed == 1
    assert runs == [7]
    assert "Tracing could not" in tracing_log.text


def test_a_reparked_entry_does_not_keep_an_earlier_parks_span(
    make_app: Callable[..., Celery], spans: InMemorySpanExporter
) -> None:
    app = make_app()
    trace(app, provider(spans))
    up = {"dep": True}
    charge = charge_task(app, up)
    breaker = Resilience.for_app(app).breaker("dep")
    breaker.force_open()
    charge.apply(args=(7,))
    [entry] = Resilience.for_app(app).backout.list()
    assert parked_span(entry.options["headers"]) is not None
    # when: tracing is off where the replay runs, and it fails and is parked again
    Runtime.for_app(app).use_tracing(None)
    breaker.reset()
    up["dep"] = False
    assert Resilience.for_app(app).drain().replayed == 1
    [again] = Resilience.for_app(app).backout.list()
    assert again.reason != "breaker_open"  # parked by its run, not left by the drain
    # then: the new entry names no span (its park made none), not the first park's
    assert PARKED_SPAN_HEADER not in again.options.get("headers", {})


# -- the pure parts ----------------------------------------------------------------------------
def test_a_span_that_records_nothing_has_no_traceparent() -> None:
    assert traceparent(NonRecordingSpan(SpanContext(0, 0, False))) is None


@pytest.mark.parametrize("kept", ["", "garbage", "00-" + "0" * 32 + "-" + "0" * 16 + "-01"])
def test_a_kept_span_that_cannot_be_read_gives_no_link(kept: str) -> None:
    assert links(kept) == []


def test_a_kept_span_gives_one_link_to_it() -> None:
    kept = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    [link] = links(kept)
    assert link.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert link.context.span_id == 0xB7AD6B7169203331


# -- metrics -----------------------------------------------------------------------------------
def test_the_metrics_are_the_prometheus_figures_under_the_same_names(
    make_app: Callable[..., Celery],
) -> None:
    app = make_app()
    charge = charge_task(app, {"dep": True})
    Resilience.for_app(app).breaker("dep").force_open()
    charge.apply(args=(7,))
    charge.apply(args=(8,))
    reader = InMemoryMetricReader()

    observe(app, MeterProvider(metric_readers=[reader]))
    data = reader.get_metrics_data()

    assert data is not None
    seen: dict[str, Any] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            assert scope.scope.name == "celery_resilience"
            seen.update({m.name: m for m in scope.metrics})
    families: list[Metric] = list(ResilienceCollector(Runtime.for_app(app)).collect())
    # The SDK exports an instrument once it has a sample: every family with one.
    assert set(seen) == {f.name for f in families if f.samples}
    parked = {
        tuple(sorted(dict(p.attributes or {}).items())): p.value
        for p in seen["celery_resilience_parked"].data.data_points
    }
    assert parked == {(("breaker", "dep"), ("reason", "breaker_open")): 2}
    assert seen["celery_resilience_parked"].data.is_monotonic is True
    assert seen["celery_resilience_oldest_parked_age_seconds"].unit == "s"
    [up] = seen["celery_resilience_up"].data.data_points
    assert up.value == 1
