"""An OpenTelemetry SDK tracer provider that keeps every finished span in memory, for the trace tests."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


def recording_provider() -> tuple[InMemorySpanExporter, TracerProvider]:
    """(exporter, provider): each span the provider's tracers end is in exporter.get_finished_spans() at once."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter, provider
