"""``tests.apps.workerapp``'s app with ``resilience_tracing`` on, for ``celery worker``
subprocesses whose spans a test reads.

The SDK's global ``TracerProvider`` is set at import, in the worker's main process, so that the
prefork pool's children inherit it. Every span is exported as it ends, as one JSON line (the
SDK's own ``ReadableSpan.to_json``) appended to the file ``OTELAPP_SPANS`` names: a synchronous
exporter, so a span is in the file before its task's outcome can be seen, and one ``write`` per
batch on a file opened for appending, so the children's lines never interleave.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from tests.apps.workerapp import make_app


class JsonLinesExporter(SpanExporter):
    """Appends each span to a file as one JSON line."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        data = "".join(span.to_json(indent=None) + "\n" for span in spans).encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        return SpanExportResult.SUCCESS


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(os.environ["OTELAPP_SPANS"])))
trace.set_tracer_provider(provider)

app = make_app(os.environ)
app.conf.resilience_tracing = True
