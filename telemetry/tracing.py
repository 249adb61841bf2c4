"""TracerProvider construction from the standard OTEL_* settings: OTLP over HTTP, a console
exporter for local runs, batch processing. The caller shuts the provider down, which flushes."""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Tracer

INSTRUMENTATION_SCOPE = "toolspan"
EXPORTERS = ("otlp", "console", "none")


def exporters_for(names: str | None, endpoint: str | None = None, traces_endpoint: str | None = None,
                  protocol: str = "http/protobuf") -> list[SpanExporter]:
    """Exporters named as in OTEL_TRACES_EXPORTER. Unset means OTLP when an endpoint is given,
    and nothing otherwise (a gateway should not fill its log with failed exports by default)."""
    if names is None:
        names = "otlp" if endpoint or traces_endpoint else "none"
    chosen = [n.strip().lower() for n in names.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in EXPORTERS]
    if unknown:
        raise ValueError(f"OTEL_TRACES_EXPORTER={names}: {', '.join(unknown)} is not supported "
                         f"(use {', '.join(EXPORTERS)})")
    exporters: list[SpanExporter] = []
    if "otlp" in chosen:
        if protocol != "http/protobuf":
            raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol} is not supported; toolspan exports "
                             "OTLP over HTTP (http/protobuf)")
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        url = traces_endpoint or f"{(endpoint or 'http://localhost:4318').rstrip('/')}/v1/traces"
        exporters.append(OTLPSpanExporter(endpoint=url))
    if "console" in chosen:
        exporters.append(ConsoleSpanExporter())
    return exporters


def build_provider(service_name: str = "toolspan", exporters: Iterable[SpanExporter] = (),
                   processors: Iterable[SpanProcessor] = ()) -> TracerProvider:
    """A provider of its own (never the global one), exporting in batches. The sampler comes
    from OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG, as the SDK reads them."""
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name}))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    for processor in processors:
        provider.add_span_processor(processor)
    return provider


def tracer_of(provider: trace.TracerProvider) -> Tracer:
    return provider.get_tracer(INSTRUMENTATION_SCOPE)
