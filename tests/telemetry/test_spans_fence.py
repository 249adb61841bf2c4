"""The gateway's tracer takes a few private members of the OpenTelemetry SDK (telemetry.spans):
each is checked when the tracer is made, and an SDK that lacks one, or has it in another shape,
gets the SDK's own tracer, with one warning naming what is missing, and spans as before."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, SynchronousMultiSpanProcessor
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.version import __version__ as sdk_version
from opentelemetry.trace import SpanContext, SpanKind

from telemetry.spans import GatewaySpan, GatewayTracer
from telemetry.tracing import build_provider, tracer_of

FALLBACK = "toolspan's spans use the SDK's own tracer (slower)"


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "toolspan.telemetry" and r.levelno == logging.WARNING]


def _fallback(caplog: pytest.LogCaptureFixture, provider: trace.TracerProvider | None = None) -> str:
    """The one warning tracer_of logs for `provider` as it falls back to the SDK's own tracer."""
    caplog.set_level(logging.WARNING, "toolspan.telemetry")
    tracer = tracer_of(provider or build_provider())
    assert isinstance(tracer, SdkTracer)
    assert not isinstance(tracer, GatewayTracer)
    [warning] = _warnings(caplog)
    assert warning.startswith(f"opentelemetry-sdk {sdk_version}: ")
    assert warning.endswith(FALLBACK)
    return warning


def test_the_sdk_as_installed_has_everything_and_no_warning_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "toolspan.telemetry")
    assert isinstance(tracer_of(build_provider()), GatewayTracer)
    assert _warnings(caplog) == []


def test_a_processor_without_on_ending_gets_the_sdk_tracer(monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    """An SDK that renamed the processors' `_on_ending`: the gateway's spans could not tell them."""
    for kind in (SpanProcessor, SynchronousMultiSpanProcessor):
        monkeypatch.delattr(kind, "_on_ending")
    assert "no SynchronousMultiSpanProcessor._on_ending" in _fallback(caplog)


def test_a_span_end_that_no_longer_calls_on_ending_gets_the_sdk_tracer(monkeypatch: pytest.MonkeyPatch,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    def end(self: SdkSpan, end_time: int | None = None) -> None:  # a newer SDK's, say: on_ending gone
        self._end_time = end_time
        self._span_processor.on_end(self)

    monkeypatch.setattr(SdkSpan, "end", end)
    assert "Span.end does not call _on_ending" in _fallback(caplog)


def test_a_tracer_without_span_limits_gets_the_sdk_tracer(monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    made = SdkTracer.__init__

    def renamed(self: SdkTracer, *args: Any, **kwargs: Any) -> None:  # `_span_limits` under another name
        made(self, *args, **kwargs)
        self._limits = self.__dict__.pop("_span_limits")  # type: ignore[attr-defined]

    monkeypatch.setattr(SdkTracer, "__init__", renamed)
    assert "no Tracer._span_limits of type SpanLimits" in _fallback(caplog)


def test_a_span_context_of_another_layout_gets_the_sdk_tracer(monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """A SpanContext with one field more: unpacking it, or making one with tuple.__new__, would be wrong."""
    made = SpanContext.__new__

    def longer(cls: type[SpanContext], *args: Any, **kwargs: Any) -> SpanContext:
        return tuple.__new__(cls, (*made(cls, *args, **kwargs), "sampling-threshold"))

    monkeypatch.setattr(SpanContext, "__new__", longer)
    assert "SpanContext is not the tuple (trace_id, span_id, is_remote" in _fallback(caplog)


def test_a_readable_span_with_a_field_ours_lack_gets_the_sdk_tracer_and_its_spans(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A newer SDK whose ReadableSpan keeps one more field behind one more property: the SDK's spans
    have it, the gateway's would not, so the SDK's tracer makes the spans, and they are exported."""
    made = ReadableSpan.__init__

    def with_flags(self: ReadableSpan, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        self._flags = 0  # type: ignore[attr-defined]

    monkeypatch.setattr(ReadableSpan, "__init__", with_flags)
    monkeypatch.setattr(ReadableSpan, "flags", property(lambda span: span._flags), raising=False)
    exporter = InMemorySpanExporter()
    provider = build_provider(processors=[SimpleSpanProcessor(exporter)])
    assert "toolspan's span is not a ReadableSpan (AttributeError" in _fallback(caplog, provider)
    tracer = tracer_of(provider)
    with tracer.start_as_current_span("POST /v1/chat/completions", kind=SpanKind.SERVER):
        tracer.start_span("chat m", kind=SpanKind.CLIENT, attributes={"gen_ai.request.model": "m"}).end()
    chat, server = exporter.get_finished_spans()
    assert not isinstance(chat, GatewaySpan)
    assert (chat.name, dict(chat.attributes or {}), server.name) == ("chat m", {"gen_ai.request.model": "m"},
                                                                   "POST /v1/chat/completions")
    assert chat.parent == server.context
