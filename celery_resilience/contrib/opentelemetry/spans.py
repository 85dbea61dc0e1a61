"""The package's spans and span events, through OpenTelemetry's tracing API.

Spans are made with the tracer of the provider given, else of the global one (a no-op until the
app sets one). Each sits under the span current where its step runs: in a worker, the
``run/<task>`` span of ``opentelemetry-instrumentation-celery`` when it is on; in beat's drain
task, the same; else a root. A replay's span links to the span that parked its entry, whose
``traceparent`` the entry keeps (``PARKED_SPAN_HEADER``), always in the W3C form, whatever
propagator the app set: every process must read what another wrote.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from opentelemetry import trace as api
from opentelemetry.trace import Link, Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ... import __version__
from ...backout.entry import ParkedTask, Reason
from ...breaker.permit import Admission
from ...headers import parked_span
from ...runtime import Runtime

T = TypeVar("T")
#: The instrumentation scope of every span the package makes.
SCOPE = "celery_resilience"
_W3C = TraceContextTextMapPropagator()


def trace(target: Any, tracer_provider: Any = None) -> OpenTelemetryTracing:
    """Turn the package's spans on for an app (or its :class:`Runtime`), with
    ``tracer_provider`` (default: the global one); what ``resilience_tracing = True`` does."""
    runtime = target if isinstance(target, Runtime) else Runtime.for_app(target)
    tracing = OpenTelemetryTracing(tracer_provider)
    runtime.use_tracing(tracing)
    return tracing


class OpenTelemetryTracing:
    """:class:`celery_resilience.tracing.Tracing` with OpenTelemetry's API."""

    def __init__(self, tracer_provider: Any = None) -> None:
        self.tracer = api.get_tracer(SCOPE, __version__, tracer_provider)

    def admission(
        self,
        task_name: str,
        task_id: str,
        breaker: str | None,
        parked_span: str | None,
        admit: Callable[[], Admission],
    ) -> Admission:
        attributes = _task(task_name, task_id, breaker)
        with self.tracer.start_as_current_span(
            "resilience.admission", attributes=attributes, links=links(parked_span)
        ) as span:
            admitted = admit()
            span.set_attribute(
                "resilience.admitted", admitted.rejected is None and not admitted.skip
            )
            if admitted.rejected is not None:
                span.set_attribute("resilience.rejected", type(admitted.rejected).__name__)
            if admitted.skip:
                span.set_attribute("resilience.skip", admitted.skip)
            return admitted

    def park(
        self,
        task_name: str,
        task_id: str,
        breaker: str | None,
        reason: Reason,
        store: Callable[[str | None], ParkedTask],
    ) -> ParkedTask:
        attributes = {**_task(task_name, task_id, breaker), "resilience.reason": reason}
        with self.tracer.start_as_current_span("resilience.park", attributes=attributes) as span:
            entry = store(traceparent(span))
            span.set_attribute("resilience.entry_id", entry.id)
            return entry

    def replay(self, entry: ParkedTask, publish: Callable[[], None]) -> None:
        attributes: dict[str, str | int] = {
            **_task(entry.task_name, entry.task_id, entry.breaker),
            "resilience.entry_id": entry.id,
            "resilience.reason": entry.reason,
            "resilience.replays": entry.replays,
        }
        with self.tracer.start_as_current_span(
            "resilience.replay",
            kind=SpanKind.PRODUCER,
            attributes=attributes,
            links=links(parked_span(entry.options.get("headers"))),
        ):
            publish()

    def drain(
        self, kind: str, run: Callable[[], T], figures: Callable[[T], Mapping[str, int]]
    ) -> T:
        with self.tracer.start_as_current_span(
            "resilience.drain", attributes={"resilience.drain.kind": kind}
        ) as span:
            report = run()
            for name, value in figures(report).items():
                span.set_attribute(f"resilience.drain.{name}", value)
            return report

    def transition(self, breaker: str, transition: str, state: str) -> None:
        span = api.get_current_span()
        if span.is_recording():  # no span here (a drain's look, the CLI): nothing to add to
            span.add_event(
                f"resilience.breaker.{transition}",
                {"resilience.breaker": breaker, "resilience.breaker.state": state},
            )


def traceparent(span: Span) -> str | None:
    """The W3C ``traceparent`` of ``span``; ``None`` for a span that records nothing."""
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=api.set_span_in_context(span))
    return carrier.get("traceparent")


def links(parked: str | None) -> list[Link]:
    """A link to the span that parked an entry (``parked``: its ``traceparent``); none when
    there is none or it can't be read."""
    if parked is None:
        return []
    context = api.get_current_span(_W3C.extract({"traceparent": parked})).get_span_context()
    if not context.is_valid:
        return []
    return [Link(context, {"resilience.link": "parked"})]


def _task(task_name: str, task_id: str, breaker: str | None) -> dict[str, str]:
    attributes = {"resilience.task_name": task_name, "resilience.task_id": task_id or ""}
    if breaker is not None:
        attributes["resilience.breaker"] = breaker
    return attributes
