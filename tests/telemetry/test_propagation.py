"""The propagators (telemetry.propagation): the default pair's headers written directly, exactly as the
propagators write them, and any other set through the propagators themselves."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace import INVALID_SPAN, NonRecordingSpan, Span, SpanContext, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from telemetry.propagation import Propagation, W3CPropagator, build_propagator
from tests.telemetry.conftest import with_baggage


def the_propagators_pair() -> CompositePropagator:
    """The default propagators, unnamed: Propagation goes through them."""
    return CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])


def remote(flags: int, state: TraceState | None = None) -> Span:
    return NonRecordingSpan(SpanContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, is_remote=False,
                                        trace_flags=TraceFlags(flags), trace_state=state))


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
