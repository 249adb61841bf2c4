"""Trace export configured by the standard OTEL_* settings."""

from __future__ import annotations

from time import time_ns

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, DEFAULT_ON, Sampler, TraceIdRatioBased
from opentelemetry.trace import NonRecordingSpan, SpanKind, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import CollectorRegistry

from gateway.instrumentation import RequestInfo
from gateway.settings import Settings
from telemetry import names
from telemetry.instrument import Instrumentation
from telemetry.metrics import Metrics
from telemetry.tracing import SpanIds, build_provider, exporters_for, tracer_of


def test_no_exporter_unless_asked_or_an_endpoint_is_set() -> None:
    assert exporters_for(None) == []
    assert exporters_for("none") == []
    [exporter] = exporters_for(None, endpoint="http://collector:4318")
    assert isinstance(exporter, OTLPSpanExporter)


@pytest.mark.parametrize(("endpoint", "traces_endpoint", "url"), [
    ("http://collector:4318", None, "http://collector:4318/v1/traces"),
    ("http://collector:4318/", None, "http://collector:4318/v1/traces"),
    (None, "http://tempo:4318/custom", "http://tempo:4318/custom"),
    (None, None, "http://localhost:4318/v1/traces"),
])
def test_otlp_endpoint_follows_the_otel_rules(endpoint: str | None, traces_endpoint: str | None, url: str) -> None:
    [exporter] = exporters_for("otlp", endpoint, traces_endpoint)
    assert isinstance(exporter, OTLPSpanExporter)
    assert exporter._endpoint == url


def test_several_exporters_by_comma() -> None:
    kinds = [type(e) for e in exporters_for("otlp, console")]
    assert kinds == [OTLPSpanExporter, ConsoleSpanExporter]


@pytest.mark.parametrize(("names", "protocol", "message"), [
    ("jaeger", "http/protobuf", "jaeger is not supported"),
    ("otlp", "grpc", "OTEL_EXPORTER_OTLP_PROTOCOL=grpc is not supported"),
])
def test_unsupported_choices_fail_at_start_up(names: str, protocol: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        exporters_for(names, protocol=protocol)


def test_standard_variables_reach_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gateway-eu")
    settings = Settings()
    assert (settings.otel_traces_exporter, settings.otel_exporter_otlp_endpoint, settings.otel_service_name) == (
        "console", "http://collector:4318", "gateway-eu")


def test_service_name_and_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    provider = build_provider("gateway-eu")
    assert provider.resource.attributes["service.name"] == "gateway-eu"
    assert provider.sampler is ALWAYS_OFF
    provider.shutdown()


REMOTE_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
REMOTE_SPAN_ID = "00f067aa0ba902b7"


def _recorded(sampler: Sampler = DEFAULT_ON) -> tuple[Tracer, SpanIds, InMemorySpanExporter]:
    """A tracer whose provider draws ids with SpanIds and keeps every ended span in memory."""
    ids = SpanIds()
    provider = TracerProvider(id_generator=ids, sampler=sampler)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test"), ids, exporter


def _only(exporter: InMemorySpanExporter) -> ReadableSpan:
    [span] = exporter.get_finished_spans()
    return span


def test_a_drawn_root_span_starts_with_the_drawn_ids() -> None:
    tracer, ids, exporter = _recorded()
    drawn = ids.draw(tracer, "POST /v1/chat", SpanKind.SERVER, None)
    assert drawn.is_valid
    assert not drawn.is_remote
    assert drawn.trace_flags.sampled
    start_ns = time_ns() - 5_000_000
    span = ids.start(tracer, drawn, "POST /v1/chat", SpanKind.SERVER, None, start_ns, {"http.route": "/v1/chat"})
    started = span.get_span_context()
    assert (started.trace_id, started.span_id) == (drawn.trace_id, drawn.span_id)
    assert started.trace_flags == drawn.trace_flags
    assert span.is_recording()
    span.end()
    exported = _only(exporter)
    assert exported.context is not None
    assert (exported.context.trace_id, exported.context.span_id) == (drawn.trace_id, drawn.span_id)
    assert exported.parent is None
    assert exported.start_time == start_ns
    assert exported.kind is SpanKind.SERVER
    assert exported.attributes is not None
    assert exported.attributes["http.route"] == "/v1/chat"


def test_a_child_drawn_under_a_drawn_parent_joins_its_trace() -> None:
    tracer, ids, exporter = _recorded()
    parent = ids.draw(tracer, "POST /v1/chat", SpanKind.SERVER, None)
    under_parent = trace.set_span_in_context(NonRecordingSpan(parent))
    child = ids.draw(tracer, "chat gpt-4o", SpanKind.CLIENT, under_parent)
    assert child.trace_id == parent.trace_id
    assert child.span_id != parent.span_id
    assert child.trace_flags == parent.trace_flags
    start_ns = time_ns()
    child_span = ids.start(tracer, child, "chat gpt-4o", SpanKind.CLIENT, under_parent, start_ns + 1)
    child_span.end()
    parent_span = ids.start(tracer, parent, "POST /v1/chat", SpanKind.SERVER, None, start_ns)
    parent_span.end()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    exported_child, exported_parent = spans["chat gpt-4o"], spans["POST /v1/chat"]
    assert exported_child.context is not None
    assert exported_parent.context is not None
    assert exported_child.parent is not None
    assert exported_child.parent.span_id == parent.span_id
    assert exported_child.parent.trace_id == parent.trace_id
    assert (exported_child.context.trace_id, exported_child.context.span_id) == (child.trace_id, child.span_id)
    assert (exported_parent.context.trace_id, exported_parent.context.span_id) == (parent.trace_id, parent.span_id)


def test_an_unsampled_remote_parent_is_followed() -> None:
    tracer, ids, exporter = _recorded()
    remote = TraceContextTextMapPropagator().extract({"traceparent": f"00-{REMOTE_TRACE_ID}-{REMOTE_SPAN_ID}-00"})
    drawn = ids.draw(tracer, "POST /v1/chat", SpanKind.SERVER, remote)
    assert drawn.trace_id == int(REMOTE_TRACE_ID, 16)
    assert not drawn.trace_flags.sampled
    span = ids.start(tracer, drawn, "POST /v1/chat", SpanKind.SERVER, remote, time_ns())
    assert not span.is_recording()
    started = span.get_span_context()
    assert (started.trace_id, started.span_id) == (drawn.trace_id, drawn.span_id)
    assert not started.trace_flags.sampled
    span.end()
    assert exporter.get_finished_spans() == ()


def test_a_sampled_remote_parent_is_followed() -> None:
    tracer, ids, exporter = _recorded()
    remote = TraceContextTextMapPropagator().extract({"traceparent": f"00-{REMOTE_TRACE_ID}-{REMOTE_SPAN_ID}-01"})
    drawn = ids.draw(tracer, "POST /v1/chat", SpanKind.SERVER, remote)
    assert drawn.trace_id == int(REMOTE_TRACE_ID, 16)
    assert drawn.span_id != int(REMOTE_SPAN_ID, 16)
    assert drawn.trace_flags.sampled
    span = ids.start(tracer, drawn, "POST /v1/chat", SpanKind.SERVER, remote, time_ns())
    assert span.is_recording()
    assert span.get_span_context().trace_flags == drawn.trace_flags
    span.end()
    exported = _only(exporter)
    assert exported.context is not None
    assert (exported.context.trace_id, exported.context.span_id) == (drawn.trace_id, drawn.span_id)
    assert exported.parent is not None
    assert exported.parent.is_remote
    assert (exported.parent.trace_id, exported.parent.span_id) == (int(REMOTE_TRACE_ID, 16), int(REMOTE_SPAN_ID, 16))


def test_the_drawn_sampling_decision_is_the_one_the_sdk_makes() -> None:
    tracer, ids, exporter = _recorded(TraceIdRatioBased(0.5))
    sampled: set[int] = set()
    unsampled: set[int] = set()
    for i in range(200):
        drawn = ids.draw(tracer, f"call {i}", SpanKind.CLIENT, None)
        span = ids.start(tracer, drawn, f"call {i}", SpanKind.CLIENT, None, time_ns())
        assert drawn.trace_flags.sampled == span.is_recording()
        assert span.get_span_context().span_id == drawn.span_id
        (sampled if drawn.trace_flags.sampled else unsampled).add(drawn.span_id)
        span.end()
    assert sampled
    assert unsampled
    exported = {s.context.span_id for s in exporter.get_finished_spans() if s.context is not None}
    assert exported == sampled


def test_drawn_ids_are_used_once() -> None:
    tracer, ids, _ = _recorded()
    drawn = ids.draw(tracer, "POST /v1/chat", SpanKind.SERVER, None)
    ids.start(tracer, drawn, "POST /v1/chat", SpanKind.SERVER, None, time_ns()).end()
    other = tracer.start_span("other").get_span_context()
    assert other.span_id != drawn.span_id
    assert other.trace_id != drawn.trace_id
    again = ids.draw(tracer, "POST /v1/chat", SpanKind.SERVER, None)
    assert (again.trace_id, again.span_id) != (drawn.trace_id, drawn.span_id)


def test_span_ids_come_only_from_a_provider_built_here() -> None:
    with pytest.raises(TypeError, match="build_provider"):
        SpanIds.of(TracerProvider().get_tracer("test"))
    provider = build_provider("gateway-eu")
    tracer = tracer_of(provider)
    ids = SpanIds.of(tracer)
    assert isinstance(ids, SpanIds)
    assert ids is provider.id_generator
    provider.shutdown()


def test_tracing_switched_off_by_the_sdk_variable_still_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    """OTEL_SDK_DISABLED=true gives a no-op tracer: requests are still counted, nothing is traced,
    and an incoming trace context is handed on as it came."""
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    registry = CollectorRegistry()
    instrumentation = Instrumentation(tracer_of(build_provider()), Metrics(registry))
    incoming = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    info = RequestInfo("POST", "/v1/chat/completions", "/v1/chat/completions", {"traceparent": incoming}, "t-1")
    with instrumentation.request(info) as request:
        with instrumentation.chat("m", stream=False) as chat:
            headers: dict[str, str] = {}
            chat.inject(headers)
            chat.response({"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 3}})
        request.finish(200)
    assert headers["traceparent"] == incoming
    assert request.trace_id == "ab" * 16
    assert registry.get_sample_value(names.METRIC_REQUESTS,
                                     {names.LABEL_ROUTE: "/v1/chat/completions", names.LABEL_STATUS: "200"}) == 1
