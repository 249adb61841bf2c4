"""Trace export configured by the standard OTEL_* settings."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import ConsoleSpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from gateway.settings import Settings
from telemetry.tracing import build_provider, exporters_for


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
