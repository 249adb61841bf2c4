"""The gateway's own spans (telemetry.spans): what the SDK's processors and exporters get is what
the SDK's tracer would have given them for the same calls, through the provider's own sampler."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased, TraceIdRatioBased
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from telemetry.spans import GatewaySpan, GatewayTracer
from telemetry.tracing import INSTRUMENTATION_SCOPE, build_provider, build_resource, tracer_of
from tests.conftest import REMOTE_SPAN, REMOTE_TRACE, TRACEPARENT

Session = Callable[[trace.Tracer], None]
RESOURCE = build_resource()  # one service.instance.id for both tracers' spans


def _a_request(tracer: trace.Tracer) -> None:
    """What the gateway does with a request's spans: a SERVER span made current, a CLIENT child,
    a tool.call with its attributes at the start and a link, statuses, attributes at the end."""
    server = tracer.start_span("POST /v1/chat/completions", kind=SpanKind.SERVER)
    token = otel_context.attach(trace.set_span_in_context(server))
    try:
        chat = tracer.start_span("chat m", kind=SpanKind.CLIENT)
        chat.set_attributes({"gen_ai.request.model": "m", "gen_ai.response.finish_reasons": ["stop"],
                             "gen_ai.usage.input_tokens": 3, "gen_ai.request.stream": False})
        chat.end()
        earlier = SpanContext(int(REMOTE_TRACE, 16), int(REMOTE_SPAN, 16), is_remote=False)
        call = tracer.start_span("tool.call", attributes={"gen_ai.tool.name": "echo", "toolspan.round": 1},
                                 links=[Link(earlier, {"toolspan.retry.kind": "verbatim"})])
        call.set_attribute("toolspan.args.missing", ("path",))
        call.set_status(Status(StatusCode.ERROR, "Tool 'echo': required arguments are missing."))
        call.set_status(StatusCode.UNSET)  # changes nothing, as with the SDK's spans
        call.end()
    finally:
        otel_context.detach(token)
    server.set_attributes({"http.response.status_code": 200, "gen_ai.conversation.id": "t1"})
    server.set_status(Status(StatusCode.OK))
    server.set_status(Status(StatusCode.ERROR, "too late: OK is final"))
    server.end()


def _failing_step(tracer: trace.Tracer) -> None:
    def step() -> None:
        with tracer.start_as_current_span("tool.execute") as span:
            span.add_event("begun", {"n": 1})
            raise KeyError("path")

    with pytest.raises(KeyError):
        step()


def _flags_and_links(tracer: trace.Tracer) -> None:
    """Links kept and dropped by the SDK's rule, and spans that leave an exception unrecorded."""
    invalid = SpanContext(0, 0, is_remote=False)
    span = tracer.start_span("links", links=[Link(invalid), Link(invalid, {"why": "kept"})])
    span.add_link(invalid)
    span.add_link(invalid, {"a": 1})
    span.end()
    with pytest.raises(KeyError), tracer.start_span("quiet", record_exception=False, set_status_on_exception=False):
        raise KeyError("x")
    with pytest.raises(KeyError), tracer.start_as_current_span("unrecorded", record_exception=False):
        raise KeyError("y")


def _exported(tracer_for: Callable[[TracerProvider], trace.Tracer], session: Session,
              sampler: Any = None) -> list[ReadableSpan]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler, resource=RESOURCE) if sampler is not None else build_provider(RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    session(tracer_for(provider))
    return list(exporter.get_finished_spans())


def _sdk(provider: TracerProvider) -> trace.Tracer:
    return provider.get_tracer(INSTRUMENTATION_SCOPE)


def _shape(span: ReadableSpan, ids: dict[int, str]) -> dict[str, Any]:
    """What an exporter reads of a span, with its ids named by their order of appearance and its
    times left out."""
    def name(span_id: int) -> str:
        return ids.setdefault(span_id, f"span{len(ids)}")

    context, parent = span.context, span.parent
    assert context is not None
    events = [(e.name, {k: v for k, v in (e.attributes or {}).items() if k != "exception.stacktrace"})
              for e in span.events]
    return {"name": span.name, "kind": span.kind, "id": name(context.span_id), "flags": int(context.trace_flags),
            "parent": name(parent.span_id) if parent is not None else None,
            "attributes": dict(span.attributes or {}), "status": (span.status.status_code, span.status.description),
            "links": [(name(link.context.span_id), dict(link.attributes or {})) for link in span.links],
            "events": events, "scope": span.instrumentation_scope, "resource": span.resource.attributes,
            "ended_after_start": (span.end_time or 0) >= (span.start_time or 1)}


@pytest.mark.parametrize("session", [_a_request, _failing_step, _flags_and_links],
                         ids=["request", "failing_step", "flags_and_links"])
def test_processors_get_what_the_sdk_tracer_would_give_them(session: Session) -> None:
    ours, theirs = _exported(tracer_of, session), _exported(_sdk, session)
    assert all(type(span) is GatewaySpan for span in ours)
    assert [_shape(s, {}) for s in ours] == [_shape(s, {}) for s in theirs]
    assert ours[0].attributes.get("gen_ai.response.finish_reasons") in (None, ("stop",))  # a list kept as a tuple


def test_otlp_encodes_them_as_it_encodes_the_sdk_spans() -> None:
    def encoded(spans: list[ReadableSpan]) -> list[dict[str, Any]]:
        [scope] = encode_spans(spans).resource_spans[0].scope_spans
        return [{"name": s.name, "kind": s.kind, "attributes": str(s.attributes), "links": len(s.links),
                 "status": str(s.status), "parent": bool(s.parent_span_id), "flags": s.flags} for s in scope.spans]

    assert encoded(_exported(tracer_of, _a_request)) == encoded(_exported(_sdk, _a_request))


def test_an_ended_span_changes_no_more(caplog: pytest.LogCaptureFixture) -> None:
    [span] = _exported(tracer_of, lambda tracer: tracer.start_span("s").end())
    assert isinstance(span, GatewaySpan)
    caplog.set_level(logging.WARNING, "toolspan.telemetry")
    span.set_attributes({"late": 1})
    span.set_status(Status(StatusCode.ERROR, "late"))
    span.end()
    assert dict(span.attributes or {}) == {}
    assert span.status.status_code is StatusCode.UNSET
    assert not span.is_recording()
    assert len([r for r in caplog.records if "ended span" in r.getMessage()]) == 2


def test_a_caller_trace_is_continued_and_its_sampling_decision_kept() -> None:
    propagator = TraceContextTextMapPropagator()
    for flags, recorded in (("01", True), ("00", False)):
        carrier = {"traceparent": TRACEPARENT[:-2] + flags}
        exporter = InMemorySpanExporter()
        provider = build_provider(processors=[SimpleSpanProcessor(exporter)])
        span = tracer_of(provider).start_span("POST /v1/chat/completions", context=propagator.extract(carrier),
                                              kind=SpanKind.SERVER)
        span.end()
        context = span.get_span_context()
        assert format(context.trace_id, "032x") == REMOTE_TRACE
        assert span.is_recording() is False
        assert isinstance(span, GatewaySpan) is recorded
        assert [format(s.parent.span_id, "016x") for s in exporter.get_finished_spans() if s.parent] == (
            [REMOTE_SPAN] if recorded else [])


@pytest.mark.parametrize(("sampler", "recorded"), [
    (ALWAYS_OFF, False), (TraceIdRatioBased(0.0), False), (ParentBased(ALWAYS_OFF), False), (ALWAYS_ON, True)])
def test_the_provider_sampler_decides(sampler: Any, recorded: bool) -> None:
    spans = _exported(tracer_of, lambda tracer: tracer.start_span("tool.call").end(), sampler)
    assert len(spans) == int(recorded)
    provider = TracerProvider(sampler=sampler)
    span = tracer_of(provider).start_span("tool.call")
    assert isinstance(span, GatewaySpan if recorded else NonRecordingSpan)
    assert span.get_span_context().trace_flags.sampled is recorded
    assert span.get_span_context().trace_flags & TraceFlags.RANDOM_TRACE_ID


def test_the_sampler_from_the_environment_is_the_providers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    assert _exported(tracer_of, _a_request) == []


def test_other_providers_keep_their_own_tracer() -> None:
    assert not isinstance(tracer_of(trace.NoOpTracerProvider()), GatewayTracer)
    assert isinstance(tracer_of(build_provider()), GatewayTracer)


def test_console_export_reads_them() -> None:
    [span] = _exported(tracer_of, lambda tracer: tracer.start_span("s", attributes={"a": [1, 2]}).end())
    assert json.loads(span.to_json())["attributes"] == {"a": [1, 2]}


class _Starts(SimpleSpanProcessor):
    """A processor that does something when a span starts: it keeps the span's name."""

    def __init__(self) -> None:
        super().__init__(InMemorySpanExporter())
        self.started: list[str] = []

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.started.append(span.name)


def test_processors_that_act_on_start_are_told_even_when_added_later() -> None:
    provider = build_provider()
    tracer = tracer_of(provider)
    tracer.start_span("before").end()  # the tracer has looked at the processors once
    first, second = _Starts(), _Starts()
    provider.add_span_processor(first)
    tracer.start_span("one").end()
    provider.add_span_processor(second)
    tracer.start_span("two").end()
    assert (first.started, second.started) == (["one", "two"], ["two"])


def test_a_processor_added_while_a_span_is_open_is_told_of_its_end_as_the_sdk_tells_it() -> None:
    ended = []
    for tracer_for in (tracer_of, _sdk):
        provider, exporter = build_provider(), InMemorySpanExporter()
        tracer = tracer_for(provider)
        tracer.start_span("before").end()  # the tracer has looked at the processors once
        span = tracer.start_span("open")
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        span.end()
        ended.append([s.name for s in exporter.get_finished_spans()])
    assert ended[0] == ended[1] == ["open"]


class _CountingIds(IdGenerator):
    """A provider's own id generator (an AWS X-Ray style one, say): the ids must be its."""

    def __init__(self) -> None:
        self.drawn = 0

    def generate_span_id(self) -> int:
        self.drawn += 1
        return 0x1000 + self.drawn

    def generate_trace_id(self) -> int:
        self.drawn += 1
        return 0xABC0000 + self.drawn


def test_a_providers_own_id_generator_makes_the_ids() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(id_generator=_CountingIds(), resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = tracer_of(provider)
    with tracer.start_as_current_span("request"):
        tracer.start_span("chat m").end()
    ids = [(s.context.trace_id, s.context.span_id) for s in exporter.get_finished_spans() if s.context]
    assert ids == [(0xABC0001, 0x1003), (0xABC0001, 0x1002)]  # the child's, then the request's


class _ZeroIds(IdGenerator):
    """An id generator gone wrong: its ids are zero, which no span context takes as valid."""

    def generate_span_id(self) -> int:
        return 0

    def generate_trace_id(self) -> int:
        return 0


def test_a_span_context_is_valid_or_not_as_the_sdk_makes_it() -> None:
    made = []
    for tracer_for in (tracer_of, _sdk):
        provider = TracerProvider(id_generator=_ZeroIds(), resource=RESOURCE)
        made.append(tracer_for(provider).start_span("s").get_span_context())
    assert made[0] == made[1]
    assert not made[0].is_valid


def test_the_sdk_ids_are_random_and_never_zero() -> None:
    tracer = tracer_of(build_provider())
    contexts = [tracer.start_span("s").get_span_context() for _ in range(200)]
    assert len({c.span_id for c in contexts}) == len({c.trace_id for c in contexts}) == 200
    assert all(0 < c.span_id < 2**64 and 0 < c.trace_id < 2**128 for c in contexts)


class _Endings(SimpleSpanProcessor):
    """A processor that acts as a span ends, before it is read (the SDK's `_on_ending`)."""

    def __init__(self) -> None:
        super().__init__(InMemorySpanExporter())
        self.ending: list[tuple[str, bool]] = []

    def _on_ending(self, span: Any) -> None:
        self.ending.append((span.name, span.end_time is not None))


def test_processors_are_told_a_span_is_ending_as_the_sdk_tells_them() -> None:
    told = []
    for tracer_for in (tracer_of, _sdk):
        processor = _Endings()
        provider = build_provider(processors=[processor])
        _a_request(tracer_for(provider))
        told.append(processor.ending)
    assert told[0] == told[1] == [("chat m", True), ("tool.call", True), ("POST /v1/chat/completions", True)]


def test_an_on_start_set_on_the_processor_itself_is_called() -> None:
    processor, started = SimpleSpanProcessor(InMemorySpanExporter()), []
    processor.on_start = lambda span, parent_context=None: started.append(span.name)  # type: ignore[method-assign]
    tracer_of(build_provider(processors=[processor])).start_span("s").end()
    assert started == ["s"]


def test_span_limits_that_could_cut_a_span_keep_the_sdk_tracer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the SDK's spans apply span limits: a provider with limits below the defaults keeps its
    own tracer, and its spans are cut as the host asked."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_span_attributes=2, max_attribute_length=3))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = tracer_of(provider)
    assert not isinstance(tracer, GatewayTracer)
    span = tracer.start_span("s", attributes={"a": 1, "b": 2})
    span.set_attribute("c", "long text")
    span.end()
    [ended] = exporter.get_finished_spans()
    assert dict(ended.attributes or {}) == {"b": 2, "c": "lon"}  # the oldest dropped, the text cut
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "16")
    assert not isinstance(tracer_of(build_provider()), GatewayTracer)
    monkeypatch.delenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT")
    assert isinstance(tracer_of(build_provider()), GatewayTracer)
