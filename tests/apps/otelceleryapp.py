"""``tests.apps.otelapp``'s app with OpenTelemetry's Celery instrumentation on as well, writing
to the same JSON-lines file, for ``celery worker`` subprocesses whose spans a test reads.

The instrumentation connects its signal handlers at import, in the worker's main process: the
prefork pool's children inherit them with the tracer provider.
"""

from __future__ import annotations

from opentelemetry.instrumentation.celery import CeleryInstrumentor

from tests.apps.otelapp import app, provider

# Its constructor carries no annotations.
CeleryInstrumentor().instrument(tracer_provider=provider)  # type: ignore[no-untyped-call]

__all__ = ["app"]
