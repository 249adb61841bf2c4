"""TracerProvider construction from the standard OTEL_* settings: OTLP over HTTP, a console
exporter for local runs, batch processing. The caller shuts the provider down, which flushes."""

from __future__ import annotations

from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from time import time_ns

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import Span, SpanContext, SpanKind, TraceFlags, Tracer
from opentelemetry.util.types import Attributes

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
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name}), id_generator=SpanIds())
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    for processor in processors:
        provider.add_span_processor(processor)
    return provider


def tracer_of(provider: TracerProvider) -> Tracer:
    return provider.get_tracer(INSTRUMENTATION_SCOPE)


_RANDOM_TRACE_ID = int(getattr(TraceFlags, "RANDOM_TRACE_ID", 0))  # W3C level 2; older SDKs lack it


class SpanIds(RandomIdGenerator):
    """The SDK's random ids, plus spans started under ids drawn in advance.

    A span's ids are needed the moment its work begins: they go into `traceparent` and onto its
    children. Starting an SDK span costs much more than drawing ids, so the gateway draws them
    when a request or provider call begins (`draw`) and starts the span itself (`start`) once
    the answer is on its way, with its true start time. The sampler decides in both places, from
    the same parent, trace id, name and kind; the SDK's samplers decide from those alone, so the
    two decisions agree (and a span under a local parent is decided as its parent was)."""

    def __init__(self) -> None:
        self._reserved: ContextVar[SpanContext | None] = ContextVar("toolspan_reserved_ids", default=None)

    @staticmethod
    def of(tracer: Tracer) -> SpanIds:
        if not isinstance(tracer, SdkTracer):  # tracing is off (OTEL_SDK_DISABLED=true gives a no-op tracer)
            return SpanIds()
        if not isinstance(tracer.id_generator, SpanIds):
            raise TypeError("the tracer must come from a provider made by telemetry.tracing.build_provider")
        return tracer.id_generator

    def generate_trace_id(self) -> int:
        reserved = self._reserved.get()
        return reserved.trace_id if reserved is not None else super().generate_trace_id()

    def generate_span_id(self) -> int:
        reserved = self._reserved.get()
        return reserved.span_id if reserved is not None else super().generate_span_id()

    def draw(self, tracer: Tracer, name: str, kind: SpanKind, parent: Context | None) -> SpanContext:
        """The context the SDK will give this span when `start` starts it."""
        if not isinstance(tracer, SdkTracer):  # a no-op tracer hands on its parent's context
            return tracer.start_span(name, context=parent, kind=kind).get_span_context()
        above = trace.get_current_span(parent).get_span_context()
        if above.is_valid and not above.is_remote:
            # Under a span this provider drew, the SDK's samplers decide as they did for that span
            # (parent-based ones follow it; the others judge the same trace id the same way).
            return SpanContext(above.trace_id, super().generate_span_id(), is_remote=False,
                               trace_flags=above.trace_flags, trace_state=above.trace_state)
        if above.is_valid:
            trace_id, random_bit = above.trace_id, above.trace_flags & _RANDOM_TRACE_ID
        else:
            trace_id, random_bit = super().generate_trace_id(), _RANDOM_TRACE_ID
        decision = tracer.sampler.should_sample(parent, trace_id, name, kind)
        sampled = TraceFlags.SAMPLED if decision.decision is Decision.RECORD_AND_SAMPLE else TraceFlags.DEFAULT
        return SpanContext(trace_id, super().generate_span_id(), is_remote=False,
                           trace_flags=TraceFlags(sampled | random_bit), trace_state=decision.trace_state)

    def start(self, tracer: Tracer, drawn: SpanContext, name: str, kind: SpanKind, parent: Context | None,
              start_ns: int, attributes: Attributes = None) -> Span:
        """The span `draw` promised: same ids, same sampling decision (the SDK's samplers do not
        look at attributes), started at `start_ns`."""
        token = self._reserved.set(drawn)
        try:
            return tracer.start_span(name, context=parent, kind=kind, attributes=attributes, start_time=start_ns)
        finally:
            self._reserved.reset(token)

    def begin(self, tracer: Tracer, name: str, kind: SpanKind, parent: Context | None) -> DrawnSpan:
        """`draw`, and keep what `start` will need: the scopes' one entry point."""
        return DrawnSpan(self, tracer, name, kind, parent, self.draw(tracer, name, kind, parent), time_ns())


@dataclass(frozen=True)
class DrawnSpan:
    """A span whose ids are drawn and whose start time is taken; `record` makes the SDK span."""

    ids: SpanIds
    tracer: Tracer
    name: str
    kind: SpanKind
    parent: Context | None
    context: SpanContext
    start_ns: int

    def record(self, attributes: Attributes = None) -> Span:
        return self.ids.start(self.tracer, self.context, self.name, self.kind, self.parent, self.start_ns, attributes)
