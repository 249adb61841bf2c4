"""The request (SERVER) span and the provider's chat (CLIENT) spans (telemetry.requests): a chat span
propagates itself with the request's baggage, sampled or not; model labels, HTTP methods and
statuses stay bounded (issue 10's hardening)."""

from __future__ import annotations

from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from prometheus_client import CollectorRegistry

from gateway.instrumentation import RequestInfo, RequestRecord
from telemetry import names
from telemetry.instrument import Telemetry
from telemetry.labels import ModelLabels
from telemetry.metrics import Metrics
from telemetry.tracing import build_provider, tracer_of
from tests.telemetry.conftest import telemetry, with_baggage


def test_a_chat_span_injects_itself_with_the_requests_baggage() -> None:
    exporter = InMemorySpanExporter()
    telemetry = Telemetry(tracer_of(build_provider(processors=[SimpleSpanProcessor(exporter)])),
                          Metrics(CollectorRegistry()))
    headers: dict[str, str] = {}
    token = otel_context.attach(with_baggage())
    try:
        with telemetry.chat("m", False, "default", "openai") as chat:
            chat.inject(headers)
    finally:
        otel_context.detach(token)
    [span] = exporter.get_finished_spans()
    assert headers == {"traceparent": f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-"
                                      f"{span.context.trace_flags:02x}",
                       "baggage": "tenant=acme,user.id=u+42"}


def test_an_unsampled_chat_span_still_propagates_but_takes_no_exemplar() -> None:
    metrics = Metrics(CollectorRegistry())
    telemetry = Telemetry(TracerProvider(sampler=ALWAYS_OFF).get_tracer("test"), metrics)
    with telemetry.chat("m", False, "default", "openai") as chat:
        headers: dict[str, str] = {}
        chat.inject(headers)
    assert int(headers["traceparent"].rsplit("-", 1)[1], 16) & 1 == 0  # a valid context, not sampled
    assert not [s for family in metrics.registry.collect() for s in family.samples if s.exemplar is not None]


# --- labels and attributes (issue 10's hardening) ----------------------------------------------------

def test_model_labels_bound_the_length_and_a_long_name_takes_no_slot() -> None:
    models = ModelLabels(limit=2, max_chars=8)

    def labels(model: str) -> str:
        return models.chat_model(model).label

    assert labels("x" * 9) == names.OTHER_MODEL
    assert labels("12345678") == "12345678"
    assert labels("x" * 10_000) == names.OTHER_MODEL
    assert labels("b") == "b"
    assert labels("c") == names.OTHER_MODEL  # the count bound still holds
    assert labels("12345678") == "12345678"


def test_an_invented_http_method_is_other_on_the_request_span() -> None:
    exporter = InMemorySpanExporter()
    method = "BREW" + "X" * 4000  # aiohttp's pure-Python parser takes any token as a method
    with telemetry(exporter).request(RequestInfo(method, "/v1/{tail:.*}", "/v1/x", {}, "traj")) as trace:
        trace.finish(405, RequestRecord())
    [span] = exporter.get_finished_spans()
    attributes = span.attributes or {}
    assert span.name == "HTTP /v1/{tail:.*}"
    assert attributes[names.ATTR_HTTP_METHOD] == "_OTHER"
    assert len(str(attributes[names.ATTR_HTTP_METHOD_ORIGINAL])) <= 200


def test_known_http_methods_are_kept() -> None:
    exporter = InMemorySpanExporter()
    with telemetry(exporter).request(RequestInfo("PATCH", "/v1/{tail:.*}", "/v1/x", {}, "traj")) as trace:
        trace.finish(200, RequestRecord())
    [span] = exporter.get_finished_spans()
    assert span.name == "PATCH /v1/{tail:.*}"
    assert names.ATTR_HTTP_METHOD_ORIGINAL not in (span.attributes or {})


def test_an_upstream_status_outside_http_is_counted_as_error() -> None:
    inst = telemetry()
    with inst.chat("m", False, "default", "openai") as trace:
        trace.failed(999, "upstream_error", "odd")
    registry = inst.metrics.registry
    labels = {"upstream": "default", "model": "m", "status": "error"}
    assert registry.get_sample_value(names.METRIC_UPSTREAM_REQUESTS, labels) == 1
