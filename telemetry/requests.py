"""The request (SERVER) span and the provider `chat {model}` (CLIENT) spans, with their metrics.

Plain SDK spans, started when their work starts and ended, with their metrics moved, when it
ends: by the time the client has the whole answer, both are recorded.
"""

from __future__ import annotations

from collections.abc import Mapping
from time import perf_counter
from types import TracebackType
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanContext, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.instrumentation import ModelAnswer, RequestInfo, RequestRecord
from telemetry import names
from telemetry.metrics import Metrics


def trace_context(context: SpanContext, headers: dict[str, str]) -> None:
    """W3C traceparent (and tracestate) naming the span of `context`: what the SDK's propagator
    writes, without its context plumbing, since this runs before every provider call."""
    if not context.is_valid:
        return  # tracing is off: the caller's own trace context, if any, travels on unchanged
    headers["traceparent"] = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    if context.trace_state:
        headers["tracestate"] = context.trace_state.to_header()


def exemplar(span: Span) -> dict[str, str] | None:
    """The exemplar labels linking a metric sample to `span`'s trace, when it is recorded."""
    context = span.get_span_context()
    return {names.EXEMPLAR_TRACE_ID: format(context.trace_id, "032x")} if context.is_valid else None


class ModelLabels:
    """Model names as metric labels: the first `limit` distinct ones, then one shared label,
    since a caller can send any string as a model."""

    def __init__(self, limit: int) -> None:
        self._seen: set[str] = set()
        self._limit = limit

    def __call__(self, model: str) -> str:
        if model in self._seen:
            return model
        if len(self._seen) >= self._limit:
            return names.OTHER_MODEL
        self._seen.add(model)
        return model


class RequestSpan:
    """The SERVER span of one request, current while the handler runs."""

    def __init__(self, tracer: Tracer, metrics: Metrics, info: RequestInfo,
                 propagator: TraceContextTextMapPropagator) -> None:
        self._tracer = tracer
        self._propagator = propagator
        self._metrics = metrics
        self._info = info
        self._status: int | None = None
        self._record = RequestRecord()

    def __enter__(self) -> RequestSpan:
        info = self._info
        parent = self._propagator.extract(info.headers) if "traceparent" in info.headers else None
        self._span = self._tracer.start_span(f"{info.method} {info.route}", context=parent, kind=SpanKind.SERVER,
                                             attributes={names.ATTR_HTTP_METHOD: info.method,
                                                         names.ATTR_HTTP_ROUTE: info.route,
                                                         names.ATTR_URL_PATH: info.path[:512]})
        self._token = otel_context.attach(trace.set_span_in_context(self._span, parent))
        self._start = perf_counter()
        self._metrics.in_flight.inc()
        return self

    @property
    def trace_id(self) -> str:
        return format(self._span.get_span_context().trace_id, "032x")

    def inject(self, headers: dict[str, str]) -> None:
        trace_context(self._span.get_span_context(), headers)

    def finish(self, status: int, record: RequestRecord) -> None:
        self._status = status
        self._record = record

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        status, record = self._status, self._record
        error_type = record.error_type
        if status is None:  # the handler never finished: cancelled, or the client went away
            status, error_type = 499, error_type or "cancelled"
        otel_context.detach(self._token)
        metrics, span = self._metrics, self._span
        metrics.in_flight.dec()
        attributes: dict[str, Any] = {names.ATTR_CONVERSATION_ID: record.trajectory_id or self._info.trajectory_id,
                                      names.ATTR_HTTP_STATUS: status}
        if error_type is not None or status >= 500:
            attributes[names.ATTR_ERROR_TYPE] = error_type or str(status)
        if record.rounds is not None:
            attributes[names.ATTR_ROUNDS] = record.rounds
            attributes[names.ATTR_ROUND_LIMIT_REACHED] = record.limit_reached
            metrics.tool_rounds.observe(record.rounds)
        span.set_attributes(attributes)
        # HTTP conventions: a refused request (4xx) is the caller's error, not the server's; work
        # cut short (499) and a stream that failed after its 200 are.
        if status >= 500 or status == 499 or (status < 400 and error_type is not None):
            span.set_status(Status(StatusCode.ERROR, error_type or f"HTTP {status}"))
        span.end()
        metrics.child(metrics.requests, self._info.route, str(status)).inc()
        metrics.child(metrics.request_duration, self._info.route).observe(perf_counter() - self._start, exemplar(span))


class ChatSpan:
    """One `chat {model}` CLIENT span around one provider call (a whole stream, when streamed)."""

    def __init__(self, tracer: Tracer, metrics: Metrics, model_label: str, model: str, stream: bool,
                 provider: str) -> None:
        self._tracer = tracer
        self._metrics = metrics
        self._label = model_label
        self._model = model
        self._stream = stream
        self._provider = provider
        self._status: str | None = None
        self._tokens: dict[str, int] = {}

    def __enter__(self) -> ChatSpan:
        self._span = self._tracer.start_span(
            f"{names.SPAN_CHAT_PREFIX} {self._model}"[:200], kind=SpanKind.CLIENT,
            attributes={names.ATTR_OPERATION_NAME: names.OPERATION_CHAT, names.ATTR_PROVIDER_NAME: self._provider,
                        names.ATTR_REQUEST_MODEL: self._model[:200], names.ATTR_REQUEST_STREAM: self._stream})
        self._start = perf_counter()
        return self

    def inject(self, headers: dict[str, str]) -> None:
        trace_context(self._span.get_span_context(), headers)

    def answered(self, answer: ModelAnswer) -> None:
        attributes: dict[str, Any] = {}
        if answer.response_id is not None:
            attributes[names.ATTR_RESPONSE_ID] = answer.response_id
        if answer.model is not None:
            attributes[names.ATTR_RESPONSE_MODEL] = answer.model
        if answer.finish_reason is not None:
            attributes[names.ATTR_FINISH_REASONS] = [answer.finish_reason]
        for attribute, kind, count in ((names.ATTR_INPUT_TOKENS, names.TOKEN_INPUT, answer.input_tokens),
                                       (names.ATTR_OUTPUT_TOKENS, names.TOKEN_OUTPUT, answer.output_tokens)):
            if count is not None:
                attributes[attribute] = count
                self._tokens[kind] = count
        self._span.set_attributes(attributes)
        self._status = "200"

    def failed(self, status: int | None, error_type: str, message: str) -> None:
        self._status = str(status) if status is not None else "error"
        attributes: Mapping[str, Any] = {names.ATTR_ERROR_TYPE: error_type}
        if status is not None:
            attributes = {**attributes, names.ATTR_HTTP_STATUS: status}
        self._span.set_attributes(attributes)
        self._span.set_status(Status(StatusCode.ERROR, message[:1024]))

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None and self._status is None:  # cancelled or broken before an answer
            kind = type(exc).__name__ if isinstance(exc, Exception) else "cancelled"
            self.failed(None, kind, str(exc) or kind)
        metrics, span = self._metrics, self._span
        span.end()
        for kind, count in self._tokens.items():
            metrics.child(metrics.tokens, self._label, kind).inc(count)
        metrics.child(metrics.upstream_requests, self._label, self._status or "error").inc()
        metrics.child(metrics.upstream_duration, self._label).observe(perf_counter() - self._start, exemplar(span))
