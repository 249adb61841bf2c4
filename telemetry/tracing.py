"""TracerProvider construction. Exporters are chosen by the caller (or, later, OTEL_* settings)."""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Tracer

INSTRUMENTATION_SCOPE = "toolspan"


def build_provider(service_name: str = "toolspan", exporters: Iterable[SpanExporter] = (),
                   processors: Iterable[SpanProcessor] = ()) -> TracerProvider:
    """A provider of its own (never the global one), exporting in batches."""
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name}))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    for processor in processors:
        provider.add_span_processor(processor)
    return provider


def tracer_of(provider: TracerProvider) -> Tracer:
    return provider.get_tracer(INSTRUMENTATION_SCOPE)
