"""The package's spans and span events, through OpenTelemetry's tracing API.

Spans are made with the tracer of the provider given, else of the global one (a no-op until the
app sets one). Each sits under the span current where its step runs: in a worker, the
``run/<task>`` span of ``opentelemetry-instrumentation-celery`` when it is on; in beat's drain
task, the same; else a root. A replay's span links to the span that parked its entry, whose
``traceparent`` the entry keeps (``PARKED_SPAN_HEADER``), always in the W3C form, whatever
propagator the app set: every process must read what another wrote.

Tracing never changes what a step does: an error of OpenTelemetry's own (a span processor or an
exporter that raises as a span starts or ends, a context that can't be read) is logged, once
per kind, and the step goes on as it would without tracing. A park must not look failed because
its span could not end (the task would be kept in the broker as well), nor a publish (the drain
would send it again).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace as api
from opentelemetry.trace import Link, Span, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ... import __version__
from ...backout.entry import ParkedTask, Reason
from ...breaker.permit import Admission
from ...headers import parked_span
from ...redact import get_logger
from ...runtime import Runtime

logger = get_logger("celery_resilience.tracing")

T = TypeVar("T")
#: The instrumentation scope of every span the package makes.
SCOPE = "celery_resilience"
_W3C = TraceContextTextMapPropagator()
#: Kinds of tracing error (what failed, the error's type) logged already; bounded, as a
#: process meets a handful at most.
_REPORTED: set[tuple[str, str]] = set()
_REPORTED_MAX = 64
NO_LINKS: Sequence[Link] = ()
#: The span of a step whose span could not start: records nothing.
NO_SPAN: Span = api.INVALID_SPAN


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
        linked = quietly("read a parked span", lambda: links(parked_span), NO_LINKS)
        with self._span(
            "resilience.admission", attributes=_task(task_name, task_id, breaker), links=linked
        ) as span:
            admitted = admit()
            quietly("set attributes", lambda: _decided(span, admitted), None)
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
        with self._span("resilience.park", attributes=attributes) as span:
            entry = store(quietly("read the span's context", lambda: traceparent(span), None))
            quietly(
                "set attributes", lambda: span.set_attribute("resilience.entry_id", entry.id), None
            )
            return entry

    def replay(self, entry: ParkedTask, publish: Callable[[], None]) -> None:
        attributes: dict[str, str | int] = {
            **_task(entry.task_name, entry.task_id, entry.breaker),
            "resilience.entry_id": entry.id,
            "resilience.reason": entry.reason,
            "resilience.replays": entry.replays,
        }
        parked = entry.options.get("headers")
        linked = quietly("read a parked span", lambda: links(parked_span(parked)), NO_LINKS)
        # INTERNAL: the package sends no trace context with the message, so no consumer span
        # pairs with this one (the Celery instrumentation's own apply_async span does).
        with self._span("resilience.replay", attributes=attributes, links=linked):
            publish()

    def drain(
        self, kind: str, run: Callable[[], T], figures: Callable[[T], Mapping[str, int]]
    ) -> T:
        with self._span("resilience.drain", attributes={"resilience.drain.kind": kind}) as span:
            report = run()

            def describe() -> None:
                for name, value in figures(report).items():
                    span.set_attribute(f"resilience.drain.{name}", value)

            quietly("set attributes", describe, None)
            return report

    def transition(self, breaker: str, transition: str, state: str) -> None:
        def add() -> None:
            span = api.get_current_span()
            if span.is_recording():  # no span here (a drain's look, the CLI): nothing to add to
                span.add_event(
                    f"resilience.breaker.{transition}",
                    {"resilience.breaker": breaker, "resilience.breaker.state": state},
                )

        quietly("add a transition event", add, None)

    @contextmanager
    def _span(self, name: str, **options: Any) -> Iterator[Span]:
        """A current span around a step, which tracing's own errors never reach: a span that
        can't start is a non-recording one, one that can't end is logged; the step's own error
        is recorded on the span and goes on unchanged."""
        span = quietly(
            f"start a {name} span",
            lambda: self.tracer.start_span(name, **options),
            NO_SPAN,
        )
        token = quietly(
            "make a span current",
            lambda: otel_context.attach(api.set_span_in_context(span)),
            None,
        )
        try:
            yield span
        except BaseException as exc:
            quietly("record an error", partial(_failed, span, exc), None)
            raise
        finally:
            if token is not None:
                quietly("restore the context", lambda: otel_context.detach(token), None)
            quietly(f"end a {name} span", span.end, None)


def quietly(what: str, step: Callable[[], T], otherwise: T) -> T:
    """``step()``, or ``otherwise`` when it raises: tracing's error, logged once per kind."""
    try:
        return step()
    except Exception as exc:
        kind = (what, type(exc).__name__)
        if kind not in _REPORTED and len(_REPORTED) < _REPORTED_MAX:
            _REPORTED.add(kind)
            logger.warning(
                "Tracing could not %s (%s: %s): the step goes on without it",
                what,
                type(exc).__name__,
                exc,
            )
        return otherwise


def _decided(span: Span, admitted: Admission) -> None:
    span.set_attribute("resilience.admitted", admitted.rejected is None and not admitted.skip)
    if admitted.rejected is not None:
        span.set_attribute("resilience.rejected", type(admitted.rejected).__name__)
    if admitted.skip:
        span.set_attribute("resilience.skip", admitted.skip)


def _failed(span: Span, exc: BaseException) -> None:
    """What ``start_as_current_span`` records of an error that leaves its block."""
    if span.is_recording():
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


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
