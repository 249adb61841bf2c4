"""The request (SERVER) span and the upstream `chat {model}` (CLIENT) spans, with their metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from time import perf_counter, time_ns
from types import TracebackType
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.instrumentation import RequestInfo
from telemetry import names
from telemetry.metrics import Metrics
from telemetry.tracing import SpanIds


def trace_context(context: SpanContext, headers: dict[str, str]) -> None:
    """W3C traceparent (and tracestate) naming the span of `context`: what the SDK's propagator
    writes, without its context plumbing, since this runs before every provider call."""
    headers["traceparent"] = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    if context.trace_state:
        headers["tracestate"] = context.trace_state.to_header()


def after_response(record: Callable[..., None], *args: Any) -> None:
    """Run `record` once the current step of the event loop is over. Ending spans and moving
    metrics is the last work of a request; deferred this way, the answer goes out first (the
    span keeps its true end time). Outside a loop it runs at once."""
    try:
        asyncio.get_running_loop().call_soon(record, *args)
    except RuntimeError:
        record(*args)


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


class RequestScope:
    """The SERVER span of one request. Its ids are drawn when the request arrives and are current
    while the handler runs; the SDK span is started and ended after the answer has gone out
    (see SpanIds)."""

    def __init__(self, tracer: Tracer, ids: SpanIds, metrics: Metrics, info: RequestInfo,
                 propagator: TraceContextTextMapPropagator) -> None:
        self._tracer = tracer
        self._ids = ids
        self._propagator = propagator
        self._metrics = metrics
        self._info = info
        self._status: int | None = None
        self._error_type: str | None = None
        self._rounds: tuple[int, bool] | None = None

    def __enter__(self) -> RequestScope:
        info = self._info
        parent = self._propagator.extract(info.headers) if "traceparent" in info.headers else None
        self._span = self._ids.begin(self._tracer, f"{info.method} {info.route}", SpanKind.SERVER, parent)
        self._trajectory = info.trajectory_id
        self._token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(self._span.context), parent))
        self._start = perf_counter()
        self._metrics.in_flight.inc()
        return self

    @property
    def trace_id(self) -> str:
        return format(self._span.context.trace_id, "032x")

    def rounds(self, count: int, limit_reached: bool) -> None:
        self._rounds = (count, limit_reached)

    def inject(self, headers: dict[str, str]) -> None:
        """traceparent/tracestate naming this request's span, for a request passed on as it is."""
        trace_context(self._span.context, headers)

    def trajectory(self, trajectory_id: str) -> None:
        self._trajectory = trajectory_id

    def finish(self, status: int, error_type: str | None = None) -> None:
        self._status = status
        self._error_type = error_type

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        status, error_type = self._status, self._error_type
        if status is None:  # the handler never finished: cancelled, or the client went away
            status, error_type = 499, error_type or "cancelled"
        otel_context.detach(self._token)
        self._metrics.in_flight.dec()
        after_response(self._record, status, error_type, time_ns(), perf_counter() - self._start)

    def _record(self, status: int, error_type: str | None, end_ns: int, elapsed: float) -> None:
        info = self._info
        attributes: dict[str, Any] = {
            names.ATTR_HTTP_METHOD: info.method, names.ATTR_HTTP_ROUTE: info.route,
            names.ATTR_URL_PATH: info.path[:512], names.ATTR_CONVERSATION_ID: self._trajectory,
            names.ATTR_HTTP_STATUS: status}
        if error_type is not None or status >= 500:
            attributes[names.ATTR_ERROR_TYPE] = error_type or str(status)
        if self._rounds is not None:
            attributes[names.ATTR_ROUNDS], attributes[names.ATTR_ROUND_LIMIT_REACHED] = self._rounds
            self._metrics.tool_rounds.observe(self._rounds[0])
        span = self._span.record(attributes)
        # HTTP conventions: a refused request (4xx) is the caller's error, not the server's; work
        # cut short (499) and a stream that failed after its 200 are.
        if status >= 500 or status == 499 or (status < 400 and error_type is not None):
            span.set_status(Status(StatusCode.ERROR, error_type or f"HTTP {status}"))
        span.end(end_time=end_ns)
        metrics = self._metrics
        metrics.child(metrics.requests, self._info.route, str(status)).inc()
        trace_id = self._span.context.trace_id
        metrics.child(metrics.request_duration, self._info.route).observe(
            elapsed, {names.EXEMPLAR_TRACE_ID: format(trace_id, "032x")} if trace_id else None)


class ChatScope:
    """One `chat {model}` CLIENT span around one provider call (a whole stream, when streamed).
    Like the request's span, its ids are drawn at the start and the SDK span is made at the end."""

    def __init__(self, tracer: Tracer, ids: SpanIds, metrics: Metrics, model_label: str, model: str, stream: bool,
                 provider: str) -> None:
        self._tracer = tracer
        self._ids = ids
        self._metrics = metrics
        self._label = model_label
        self._model = model
        self._stream = stream
        self._provider = provider
        self._status: str | None = None
        self._answer: dict[str, Any] = {}  # span attributes from the provider's answer
        self._failure: tuple[dict[str, Any], str] | None = None  # error attributes, status message

    def __enter__(self) -> ChatScope:
        self._span = self._ids.begin(self._tracer, f"{names.SPAN_CHAT_PREFIX} {self._model}"[:200], SpanKind.CLIENT,
                                     otel_context.get_current())
        self._start = perf_counter()
        return self

    def inject(self, headers: dict[str, str]) -> None:
        """traceparent/tracestate naming this span, for the provider."""
        trace_context(self._span.context, headers)

    def response(self, body: Mapping[str, Any]) -> None:
        attributes: dict[str, Any] = {}
        if isinstance(body.get("id"), str):
            attributes[names.ATTR_RESPONSE_ID] = body["id"]
        if isinstance(body.get("model"), str):
            attributes[names.ATTR_RESPONSE_MODEL] = body["model"]
        raw_choices = body.get("choices")
        choices: list[Any] = raw_choices if isinstance(raw_choices, list) else []
        reasons = [str(c.get("finish_reason")) for c in choices if isinstance(c, dict) and c.get("finish_reason")]
        if reasons:
            attributes[names.ATTR_FINISH_REASONS] = reasons
        raw_usage = body.get("usage")
        usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
        for attribute, key in ((names.ATTR_INPUT_TOKENS, "prompt_tokens"),
                               (names.ATTR_OUTPUT_TOKENS, "completion_tokens")):
            count = usage.get(key)
            if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
                attributes[attribute] = count
        self._answer = attributes  # recorded once the answer has gone on (see __exit__)
        self._status = "200"

    def failed(self, status: int | None, error_type: str, message: str) -> None:
        self._status = str(status) if status is not None else "error"
        attributes: dict[str, Any] = {names.ATTR_ERROR_TYPE: error_type}
        if status is not None:
            attributes[names.ATTR_HTTP_STATUS] = status
        self._failure = attributes, message[:1024]

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None and self._status is None:  # cancelled or broken before an answer
            kind = type(exc).__name__ if isinstance(exc, Exception) else "cancelled"
            self.failed(None, kind, str(exc) or kind)
        after_response(self._record, time_ns(), perf_counter() - self._start)

    def _record(self, end_ns: int, elapsed: float) -> None:
        metrics, answer, failure = self._metrics, self._answer, self._failure
        span = self._span.record({
            names.ATTR_OPERATION_NAME: names.OPERATION_CHAT, names.ATTR_PROVIDER_NAME: self._provider,
            names.ATTR_REQUEST_MODEL: self._model[:200], names.ATTR_REQUEST_STREAM: self._stream,
            **answer, **(failure[0] if failure else {})})
        if failure is not None:
            span.set_status(Status(StatusCode.ERROR, failure[1]))
        if answer:
            for attribute, kind in ((names.ATTR_INPUT_TOKENS, names.TOKEN_INPUT),
                                    (names.ATTR_OUTPUT_TOKENS, names.TOKEN_OUTPUT)):
                if attribute in answer:
                    metrics.child(metrics.tokens, self._label, kind).inc(answer[attribute])
        span.end(end_time=end_ns)
        metrics.child(metrics.upstream_requests, self._label, self._status or "error").inc()
        trace_id = self._span.context.trace_id
        metrics.child(metrics.upstream_duration, self._label).observe(
            elapsed, {names.EXEMPLAR_TRACE_ID: format(trace_id, "032x")} if trace_id else None)
