"""Trace export configured by the standard OTEL_* settings."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, DEFAULT_ON, Sampler, TraceIdRatioBased
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry

from gateway.apis.chat.answer import read_chat
from gateway.instrumentation import RequestInfo, RequestRecord
from gateway.runtime.process import build_telemetry
from gateway.settings.model import Settings
from telemetry import names
from telemetry.instrument import Telemetry
from telemetry.metrics import Metrics
from telemetry.tracing import build_provider, build_resource, exporters_for, tracer_of
from tests.conftest import REMOTE_SPAN, REMOTE_TRACE


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
    # A backend's advertised OTLP address, pasted into the base variable: taken whole, not doubled.
    ("http://127.0.0.1:6006/v1/traces", None, "http://127.0.0.1:6006/v1/traces"),
    ("https://cloud.langfuse.com/api/public/otel/v1/traces/", None,
     "https://cloud.langfuse.com/api/public/otel/v1/traces"),
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
    provider = build_provider(build_resource("gateway-eu"))
    assert provider.resource.attributes["service.name"] == "gateway-eu"
    assert provider.sampler is ALWAYS_OFF
    provider.shutdown()


def _recorded(sampler: Sampler = DEFAULT_ON) -> tuple[Telemetry, InMemorySpanExporter, CollectorRegistry]:
    """Telemetry on a provider that keeps every ended span in memory."""
    provider = TracerProvider(sampler=sampler)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    registry = CollectorRegistry()
    return Telemetry(tracer_of(provider), Metrics(registry)), exporter, registry


def _info(headers: dict[str, str] | None = None) -> RequestInfo:
    return RequestInfo("POST", "/v1/chat/completions", "/v1/chat/completions", headers or {}, "t-1")


def test_request_and_chat_spans_are_recorded_when_their_scopes_end() -> None:
    telemetry, exporter, registry = _recorded()
    with telemetry.request(_info()) as request:
        with telemetry.chat("gpt-4o", False, "default", "openai") as chat:
            headers: dict[str, str] = {}
            chat.inject(headers)
            assert exporter.get_finished_spans() == ()  # started, not ended
        [chat_span] = exporter.get_finished_spans()  # ended with its scope, not later
        request.finish(200, RequestRecord(rounds=1))
    spans = {s.name: s for s in exporter.get_finished_spans()}
    server, client = spans["POST /v1/chat/completions"], spans["chat gpt-4o"]
    assert server.kind is SpanKind.SERVER
    assert client.kind is SpanKind.CLIENT
    assert client.parent is not None
    assert server.context is not None
    assert client.context is not None
    assert client.parent.span_id == server.context.span_id
    assert headers["traceparent"].startswith(f"00-{client.context.trace_id:032x}-{client.context.span_id:016x}-")
    assert request.trace_id == f"{server.context.trace_id:032x}"
    assert chat_span.name == "chat gpt-4o"
    assert registry.get_sample_value(names.METRIC_REQUESTS,
                                     {names.LABEL_ROUTE: "/v1/chat/completions", names.LABEL_STATUS: "200"}) == 1


@pytest.mark.parametrize("flags", ["00", "01"])
def test_a_remote_parent_is_followed_sampled_or_not(flags: str) -> None:
    telemetry, exporter, _ = _recorded()
    incoming = f"00-{REMOTE_TRACE}-{REMOTE_SPAN}-{flags}"
    with telemetry.request(_info({"traceparent": incoming})) as request:
        with telemetry.chat("m", True, "default", "openai") as chat:
            headers: dict[str, str] = {}
            chat.inject(headers)
        request.finish(200, RequestRecord())
    assert request.trace_id == REMOTE_TRACE
    assert headers["traceparent"].startswith(f"00-{REMOTE_TRACE}-")
    assert int(headers["traceparent"][-2:], 16) & 1 == int(flags, 16)
    exported = exporter.get_finished_spans()
    if flags == "00":
        assert exported == ()
        return
    server = next(s for s in exported if s.kind is SpanKind.SERVER)
    assert server.parent is not None
    assert server.parent.is_remote
    assert (server.parent.trace_id, server.parent.span_id) == (int(REMOTE_TRACE, 16), int(REMOTE_SPAN, 16))


def test_a_host_application_hands_in_its_own_tracer_provider() -> None:
    """The host's provider, sampler and processors are used as they are; it stays the host's."""
    host = TracerProvider(sampler=TraceIdRatioBased(1.0))
    exporter = InMemorySpanExporter()
    host.add_span_processor(SimpleSpanProcessor(exporter))
    built = build_telemetry(Settings(), tracer_provider=host)
    assert built.provider is None  # toolspan does not shut the host's provider down
    with built.instrumentation.request(_info()) as request:
        request.finish(204, RequestRecord())
    [span] = exporter.get_finished_spans()
    assert span.name == "POST /v1/chat/completions"
    assert span.instrumentation_scope is not None
    assert span.instrumentation_scope.name == "toolspan"


def test_tracing_switched_off_by_the_sdk_variable_still_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    """OTEL_SDK_DISABLED=true gives a no-op tracer: requests are still counted, nothing is traced,
    and an incoming trace context is handed on as it came."""
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    registry = CollectorRegistry()
    instrumentation = Telemetry(tracer_of(build_provider()), Metrics(registry))
    incoming = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    info = RequestInfo("POST", "/v1/chat/completions", "/v1/chat/completions", {"traceparent": incoming}, "t-1")
    with instrumentation.request(info) as request:
        with instrumentation.chat("m", False, "default", "openai") as chat:
            headers: dict[str, str] = {}
            chat.inject(headers)
            chat.answered(read_chat({"id": "chatcmpl-1", "choices": [{"message": {}}], "usage": {"prompt_tokens": 3}}))
        request.finish(200, RequestRecord())
    assert headers["traceparent"] == incoming
    assert request.trace_id == "ab" * 16
    assert registry.get_sample_value(names.METRIC_REQUESTS,
                                     {names.LABEL_ROUTE: "/v1/chat/completions", names.LABEL_STATUS: "200"}) == 1
