"""What the request and chat spans' shortcuts must keep as they were: exemplars sampled at most once
per bucket per second of each series, and the default propagators' headers written directly,
exactly as the propagators write them."""

from __future__ import annotations

import pytest
from opentelemetry import baggage, trace
from opentelemetry import context as otel_context
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import INVALID_SPAN, NonRecordingSpan, Span, SpanContext, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import CollectorRegistry

from telemetry import names
from telemetry.instrument import Telemetry
from telemetry.metrics import EXEMPLAR_INTERVAL, REQUEST_DURATION_BUCKETS, Metrics
from telemetry.propagation import Propagation, W3CPropagator, build_propagator
from telemetry.tracing import build_provider, tracer_of

ROUTE = "/v1/chat/completions"


def bucket_exemplars(metrics: Metrics) -> dict[str, tuple[str, float]]:
    """The request duration's exemplars, by bucket: (trace id, value)."""
    return {s.labels["le"]: (s.exemplar.labels[names.EXEMPLAR_TRACE_ID], s.exemplar.value)
            for family in metrics.registry.collect() for s in family.samples
            if s.name == f"{names.METRIC_REQUEST_DURATION}_bucket" and s.exemplar is not None}


# --- exemplars -----------------------------------------------------------------------------------

def test_a_bucket_takes_one_exemplar_a_second() -> None:
    metrics = Metrics(CollectorRegistry())
    duration = metrics.request_series(ROUTE, 200).duration
    duration.observe(0.02, 0xA, now=100.0)
    duration.observe(0.021, 0xB, now=100.0 + EXEMPLAR_INTERVAL / 2)  # same bucket, too soon: observed plainly
    duration.observe(0.3, 0xC, now=100.0 + EXEMPLAR_INTERVAL / 2)  # another bucket: its own second
    assert bucket_exemplars(metrics) == {"0.025": (f"{0xA:032x}", 0.02), "0.5": (f"{0xC:032x}", 0.3)}
    duration.observe(0.022, 0xD, now=100.0 + EXEMPLAR_INTERVAL)
    assert bucket_exemplars(metrics)["0.025"] == (f"{0xD:032x}", 0.022)
    assert metrics.registry.get_sample_value(f"{names.METRIC_REQUEST_DURATION}_count", {"route": ROUTE}) == 4


def test_an_observation_without_a_trace_leaves_the_bucket_free() -> None:
    metrics = Metrics(CollectorRegistry())
    duration = metrics.request_series(ROUTE, 200).duration
    duration.observe(0.02, None, now=100.0)  # a trace nobody keeps: no exemplar, and no turn taken
    duration.observe(0.02, 0xA, now=100.0)
    assert bucket_exemplars(metrics) == {"0.025": (f"{0xA:032x}", 0.02)}


def test_the_limit_is_per_series_shared_by_every_status() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.request_series(ROUTE, 200).duration.observe(0.02, 0xA, now=100.0)
    metrics.request_series(ROUTE, 500).duration.observe(0.02, 0xB, now=100.1)  # the same duration series
    metrics.request_series("/v1/responses", 200).duration.observe(0.02, 0xC, now=100.1)  # another series
    found = {(s.labels["route"], s.labels["le"]): s.exemplar.labels[names.EXEMPLAR_TRACE_ID]
             for family in metrics.registry.collect() for s in family.samples
             if s.name == f"{names.METRIC_REQUEST_DURATION}_bucket" and s.exemplar is not None}
    assert found == {(ROUTE, "0.025"): f"{0xA:032x}", ("/v1/responses", "0.025"): f"{0xC:032x}"}


@pytest.mark.parametrize("value", [0.0, *REQUEST_DURATION_BUCKETS, 0.0051, 1e9])
def test_the_exemplar_lands_in_the_bucket_prometheus_counts_the_value_in(value: float) -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.request_series(ROUTE, 200).duration.observe(value, 0xA, now=100.0)
    [(bucket, _)] = bucket_exemplars(metrics).items()
    counted = [s.labels["le"] for family in metrics.registry.collect() for s in family.samples
               if s.name == f"{names.METRIC_REQUEST_DURATION}_bucket" and s.value == 1]
    assert bucket == counted[0]  # the first (lowest) bucket that counts it


@pytest.mark.parametrize("bound", REQUEST_DURATION_BUCKETS)
def test_the_limiter_takes_turns_by_the_buckets_prometheus_counts_in(bound: float) -> None:
    """A value on a bucket's bound and one just above it fall in two buckets: each takes its own
    exemplar within the same second."""
    metrics = Metrics(CollectorRegistry())
    duration = metrics.request_series(ROUTE, 200).duration
    duration.observe(bound, 0xA, now=100.0)
    duration.observe(bound * 1.0001, 0xB, now=100.0)
    assert sorted(trace for trace, _ in bucket_exemplars(metrics).values()) == [f"{0xA:032x}", f"{0xB:032x}"]


# --- propagation ---------------------------------------------------------------------------------

def the_propagators_pair() -> CompositePropagator:
    """The default propagators, unnamed: Propagation goes through them."""
    return CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])


def remote(flags: int, state: TraceState | None = None) -> Span:
    return NonRecordingSpan(SpanContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, is_remote=False,
                                        trace_flags=TraceFlags(flags), trace_state=state))


def with_baggage() -> Context:
    return baggage.set_baggage("user.id", "u 42", baggage.set_baggage("tenant", "acme"))


SPANS = {
    "sampled": (remote(0x01), None),
    "not-sampled": (remote(0x00), None),
    "random-trace-id": (remote(0x03), None),
    "tracestate": (remote(0x01, TraceState([("vendor", "opaque"), ("other", "x")])), None),
    "baggage": (remote(0x01), with_baggage()),
    "invalid-span": (INVALID_SPAN, with_baggage()),
}


@pytest.mark.parametrize("case", SPANS, ids=list(SPANS))
@pytest.mark.parametrize("sent", [{}, {"Traceparent": "00-1-2-01", "BAGGAGE": "a=b", "tracestate": "x=y"}],
                         ids=["fresh", "stale"])
def test_the_default_propagators_headers_are_written_as_they_write_them(case: str, sent: dict[str, str]) -> None:
    span, parent = SPANS[case]
    parent = parent if parent is not None else Context()
    direct, through = {"Content-Type": "application/json", **sent}, {"Content-Type": "application/json", **sent}
    Propagation(build_propagator()).inject_span(direct, span, parent)
    Propagation(the_propagators_pair()).inject(through, trace.set_span_in_context(span, parent))
    assert list(direct.items()) == list(through.items())


def test_only_the_default_propagators_are_written_directly() -> None:
    assert type(build_propagator()) is W3CPropagator
    assert type(build_propagator("tracecontext, baggage")) is W3CPropagator
    assert type(build_propagator("baggage,tracecontext")) is not W3CPropagator  # baggage first: their order kept
    assert type(build_propagator("tracecontext")) is not W3CPropagator


def test_other_propagators_see_the_span_in_its_context() -> None:
    span, parent = remote(0x01), with_baggage()
    headers: dict[str, str] = {}
    Propagation(build_propagator("baggage,tracecontext")).inject_span(headers, span, parent)
    assert headers == {"baggage": "tenant=acme,user.id=u+42",
                       "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}


def test_a_chat_span_injects_itself_with_the_requests_baggage() -> None:
    exporter = InMemorySpanExporter()
    telemetry = Telemetry(tracer_of(build_provider(processors=[SimpleSpanProcessor(exporter)])),
                          Metrics(CollectorRegistry()))
    headers: dict[str, str] = {}
    token = otel_context.attach(with_baggage())
    try:
        with telemetry.chat("m", False) as chat:
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
    with telemetry.chat("m", False) as chat:
        headers: dict[str, str] = {}
        chat.inject(headers)
    assert int(headers["traceparent"].rsplit("-", 1)[1], 16) & 1 == 0  # a valid context, not sampled
    assert not [s for family in metrics.registry.collect() for s in family.samples if s.exemplar is not None]
