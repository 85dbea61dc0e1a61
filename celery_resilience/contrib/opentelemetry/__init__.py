"""OpenTelemetry for celery-resilience (the ``opentelemetry`` extra): spans, span events and
metrics. See the operations guide's tracing section."""

from .figures import observe
from .spans import OpenTelemetryTracing, trace

__all__ = ["OpenTelemetryTracing", "observe", "trace"]
