"""The standard OTEL_* variables, read by Settings and turned into the resource, the propagators and
the switch that turns tracing off."""

from __future__ import annotations

import logging
from importlib.metadata import entry_points

import pytest
from opentelemetry.sdk.resources import Resource

from gateway.runtime.process import build_telemetry
from gateway.settings.model import Settings
from telemetry.instrument import Telemetry
from telemetry.propagation import build_propagator
from telemetry.tracing import build_resource, resource_attributes

OTEL_VARIABLES = ("OTEL_SDK_DISABLED", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_PROPAGATORS")


@pytest.fixture(autouse=True)
def clean_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def resource_of(settings: Settings) -> Resource:
    built = build_telemetry(settings)
    assert built.provider is not None
    built.provider.shutdown()
    return built.provider.resource


# --- resource ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "parsed"), [
    (None, {}),
    ("", {}),
    ("team=agents", {"team": "agents"}),
    (" team = agents , region=eu-west ", {"team": "agents", "region": "eu-west"}),
    ("deployment.environment=prod%20eu,note=a%2Cb%3Dc", {"deployment.environment": "prod eu", "note": "a,b=c"}),
    ("query=a=b", {"query": "a=b"}),
    ("team=agents,", {"team": "agents"}),
    ("name=caf%C3%A9", {"name": "café"}),
    ("empty=", {"empty": ""}),
])
def test_resource_attributes_are_parsed_as_the_spec_says(raw: str | None, parsed: dict[str, str]) -> None:
    assert resource_attributes(raw) == parsed


@pytest.mark.parametrize("raw", ["team=agents,oops", "=value", "bad=%FF"], ids=["no-equals", "no-key", "not-utf8"])
def test_malformed_resource_attributes_are_refused(raw: str) -> None:
    with pytest.raises(ValueError, match="OTEL_RESOURCE_ATTRIBUTES"):
        resource_attributes(raw)


@pytest.mark.parametrize(("service_name", "attributes", "expected"), [
    (None, None, "toolspan"),
    (None, "team=agents", "toolspan"),
    (None, "service.name=from-attributes", "from-attributes"),
    ("from-variable", "service.name=from-attributes", "from-variable"),
    ("from-variable", None, "from-variable"),
    ("", "service.name=from-attributes", "from-attributes"),  # an empty variable is an unset one
    (None, "service.name=", "toolspan"),
], ids=["neither", "other-attributes", "attributes", "both", "variable", "empty-variable", "empty-attribute"])
def test_service_name_precedence(monkeypatch: pytest.MonkeyPatch, service_name: str | None,
                                 attributes: str | None, expected: str) -> None:
    """OTEL_SERVICE_NAME wins over service.name in OTEL_RESOURCE_ATTRIBUTES; toolspan applies
    when neither names one."""
    if service_name is not None:
        monkeypatch.setenv("OTEL_SERVICE_NAME", service_name)
    if attributes is not None:
        monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", attributes)
    assert resource_of(Settings()).attributes["service.name"] == expected


def test_resource_attributes_reach_the_resource(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod%20eu,team=agents")
    attributes = resource_of(Settings()).attributes
    assert attributes["deployment.environment"] == "prod eu"
    assert attributes["team"] == "agents"
    assert attributes["telemetry.sdk.language"] == "python"  # what Resource.create adds as well
    assert attributes["service.instance.id"]


def test_the_resource_comes_from_the_settings_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Values given to Settings (flags, config) win, and the SDK does not read the environment
    behind their back."""
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "stale=1")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-variable")
    attributes = resource_of(Settings(otel_resource_attributes="fresh=1", otel_service_name="from-flag")).attributes
    assert attributes["fresh"] == "1"
    assert "stale" not in attributes
    assert attributes["service.name"] == "from-flag"


def test_malformed_resource_attributes_are_dropped_with_an_error(monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """As the spec says: the whole value is discarded and an error reported; tracing goes on."""
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "team=agents,service.name=x,oops")
    with caplog.at_level(logging.ERROR):
        attributes = resource_of(Settings()).attributes
    assert "team" not in attributes
    assert attributes["service.name"] == "toolspan"
    assert "OTEL_RESOURCE_ATTRIBUTES" in caplog.text


def test_build_resource_without_settings() -> None:
    resource = build_resource()
    assert resource.attributes["service.name"] == "toolspan"


# --- OTEL_SDK_DISABLED -------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "disabled"), [("true", True), ("TRUE", True), (" True ", True),
                                                 ("false", False), ("", False), ("1", False), ("yes", False)])
def test_sdk_disabled_only_when_true(monkeypatch: pytest.MonkeyPatch, value: str, disabled: bool) -> None:
    """The OTel rule for booleans: only "true" (any case) is true; anything else is false."""
    monkeypatch.setenv("OTEL_SDK_DISABLED", value)
    assert Settings().otel_sdk_disabled is disabled


def test_sdk_disabled_builds_no_tracer_provider_but_keeps_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    built = build_telemetry(Settings())
    assert built.provider is None
    assert isinstance(built.instrumentation, Telemetry)


# --- OTEL_PROPAGATORS --------------------------------------------------------------------------------

@pytest.mark.parametrize(("configured", "fields"), [
    ("tracecontext,baggage", {"traceparent", "tracestate", "baggage"}),
    ("", {"traceparent", "tracestate", "baggage"}),  # empty: the default
    ("tracecontext", {"traceparent", "tracestate"}),
    ("baggage", {"baggage"}),
    ("tracecontext,tracecontext", {"traceparent", "tracestate"}),
    ("none", set()),
    ("None", set()),
    ("tracecontext,none", set()),  # none wins, as in the OpenTelemetry SDK
])
def test_propagators_by_name(configured: str, fields: set[str]) -> None:
    assert build_propagator(configured).fields == fields


def test_propagators_come_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().otel_propagators == "tracecontext,baggage"
    monkeypatch.setenv("OTEL_PROPAGATORS", "baggage")
    assert Settings().otel_propagators == "baggage"


@pytest.mark.skipif(bool(entry_points(group="opentelemetry_propagator", name="b3")),
                    reason="opentelemetry-propagator-b3 is installed")
def test_b3_needs_its_package() -> None:
    message = r"^OTEL_PROPAGATORS=b3multi: b3multi is not supported .*opentelemetry-propagator-b3"
    with pytest.raises(ValueError, match=message):
        build_propagator("b3multi")


def test_an_unknown_propagator_fails_at_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_PROPAGATORS", "tracecontext,jaegerish")
    with pytest.raises(ValueError, match="jaegerish is not supported"):
        build_telemetry(Settings())
