"""Where the decision log records go (issue 57): OTEL_LOGS_EXPORTER and the OTLP endpoints, with
the start-up refusals of a URL that names the other signal's path."""

from __future__ import annotations

import pytest

from gateway.runtime.process import build_telemetry
from gateway.settings.model import Settings
from telemetry.decisions import log_exporter_names, logs_url
from telemetry.instrument import Telemetry
from telemetry.tracing import export_plan


@pytest.mark.parametrize(("endpoint", "logs_endpoint", "url"), [
    (None, None, "http://localhost:4318/v1/logs"),
    ("http://collector:4318/", None, "http://collector:4318/v1/logs"),
    (None, "http://loki:3100/otlp/v1/logs", "http://loki:3100/otlp/v1/logs"),
    # A backend's traces URL pasted into the base variable: its logs go beside it, not under it.
    ("http://127.0.0.1:6006/v1/traces", None, "http://127.0.0.1:6006/v1/logs"),
    ("http://collector:4318/v1/logs/", None, "http://collector:4318/v1/logs"),
])
def test_the_records_go_to_the_logs_url_the_otel_rules_give(endpoint: str | None, logs_endpoint: str | None,
                                                           url: str) -> None:
    assert logs_url(endpoint, logs_endpoint) == url


def test_a_base_url_ending_in_v1_logs_still_sends_spans_to_v1_traces() -> None:
    assert export_plan("otlp", "http://collector:4318/v1/logs").otlp_url == "http://collector:4318/v1/traces"


@pytest.mark.parametrize(("overrides", "message"), [
    ({"otel_exporter_otlp_traces_endpoint": "http://c:4318/v1/logs"},
     "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://c:4318/v1/logs ends in /v1/logs.*OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"),
    ({"otel_logs_exporter": "otlp", "otel_exporter_otlp_logs_endpoint": "http://c:4318/v1/traces"},
     "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT=http://c:4318/v1/traces ends in /v1/traces.*OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
    ({"otel_logs_exporter": "loki"}, "OTEL_LOGS_EXPORTER=loki: loki is not supported"),
])
def test_a_url_of_the_other_signal_or_an_unknown_exporter_fails_at_start_up(overrides: dict[str, str],
                                                                            message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_telemetry(Settings(**overrides))


def test_no_records_unless_an_exporter_is_named() -> None:
    assert log_exporter_names(None) == log_exporter_names("none") == ()
    assert log_exporter_names("otlp, console") == ("otlp", "console")
    off = build_telemetry(Settings(otel_exporter_otlp_endpoint="http://collector:4318", trajectory_store=False))
    assert off.provider is not None
    off.provider.shutdown()
    assert off.log_provider is None
    assert isinstance(off.instrumentation, Telemetry)
    assert off.instrumentation.decisions is None
    on = build_telemetry(Settings(otel_logs_exporter="console", trajectory_store=False))
    assert on.log_provider is not None
    on.log_provider.shutdown()
    assert isinstance(on.instrumentation, Telemetry)
    assert on.instrumentation.decisions is not None
