"""The request (SERVER) span and the provider `chat {model}` (CLIENT) spans, with their metrics.

The spans (the gateway tracer's, `telemetry.spans`) start when their work starts and are recorded
(attributes, end, metrics) when it ends. The request's scope ends before aiohttp sends the end of
its answer, so by the time a client has the whole answer, its spans and metrics are recorded.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from time import perf_counter
from types import TracebackType
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import INVALID_SPAN, Link, Span, SpanContext, SpanKind, Status, StatusCode, TraceFlags, Tracer

from gateway.instrumentation import MessageView, ModelAnswer, RequestInfo, RequestRecord
from telemetry import names
from telemetry.bounds import bounded
from telemetry.labels import ChatModel
from telemetry.messages import MessageCapture
from telemetry.metrics import Metrics
from telemetry.propagation import Propagation
from telemetry.tally import RequestTally, request_tally, tally_context

log = logging.getLogger("toolspan.telemetry")

def exemplar_trace_id(span: Span, context: SpanContext) -> int | None:
    """The trace a metric sample's exemplar may point to: `span`'s (whose context is `context`),
    only for a span this process records and the sampler kept, since no other trace can be found
    where the exemplar points. Read when the span starts (an ended span no longer says whether it
    records)."""
    trace_id, _, _, flags, _, _ = context  # its fields at once (SpanContext is a tuple)
    return trace_id if flags & TraceFlags.SAMPLED and span.is_recording() else None


def _method(method: str) -> tuple[str, str | None]:
    """The method as the HTTP conventions record it, and the original when that is `_OTHER`: the
    pure-Python HTTP parser takes any token as a method."""
    if method in names.HTTP_METHODS:
        return method, None
    return names.HTTP_METHOD_OTHER, bounded(method)


def _status_label(status: int) -> str:
    return str(status) if 100 <= status <= 599 else "error"


class RequestSpan:
    """The SERVER span of one request, current while the handler runs."""

    __slots__ = ("_context", "_exemplar_trace", "_handled", "_info", "_method", "_metrics", "_original_method",
                 "_own_sampling", "_propagation", "_span", "_start", "_status", "_tally", "_token", "_tracer",
                 "trace_id")

    def __init__(self, tracer: Tracer, metrics: Metrics, info: RequestInfo, propagation: Propagation,
                 own_sampling: bool = False) -> None:
        self._tracer = tracer
        self._propagation = propagation
        self._metrics = metrics
        self._info = info
        self._own_sampling = own_sampling
        self._method, self._original_method = _method(info.method)
        self._status: int | None = None
        self._handled: RequestRecord | None = None  # what the handler reported
        self.trace_id: str | None = None  # the trace's id in hex, while there is a valid one

    def __enter__(self) -> RequestSpan:
        parent = self._propagation.extract(self._info.headers)
        self._span = span = self._open(parent)
        self._tally = tally = RequestTally()
        self._context = tally_context(tally, trace.set_span_in_context(span, parent))
        self._token = otel_context.attach(self._context)
        span_context = span.get_span_context()
        trace_id, *_, valid = span_context  # its fields at once (SpanContext is a tuple)
        # Tracing off (a no-op tracer) and no caller's trace: no valid trace, so no id to name.
        self.trace_id = "%032x" % trace_id if valid else None  # noqa: UP031  # faster than format()
        self._exemplar_trace = exemplar_trace_id(span, span_context)
        self._start = perf_counter()
        self._metrics.in_flight.inc()
        return self

    def _open(self, parent: Context | None) -> Span:
        """The SERVER span: a child of the caller's span; or, sampling on its own, a root the
        configured sampler decides on, linked to the caller's span (its baggage still goes on)."""
        # Attributes are set when the span is recorded (the SDK's samplers do not read them).
        name = f"{self._method if self._original_method is None else names.SPAN_HTTP_OTHER} {self._info.route}"
        if self._own_sampling and parent is not None:
            remote = trace.get_current_span(parent).get_span_context()
            root = trace.set_span_in_context(INVALID_SPAN, parent)
            links = (Link(remote),) if remote.is_valid else ()
            span = self._tracer.start_span(name, context=root, kind=SpanKind.SERVER, links=links)
            if span.get_span_context().is_valid:
                return span
            # A tracer that makes no spans (OTEL_SDK_DISABLED): the caller's context goes on as it came.
        return self._tracer.start_span(name, context=parent, kind=SpanKind.SERVER)

    def inject(self, headers: dict[str, str]) -> None:
        self._propagation.inject_span(headers, self._span, self._context)

    def finish(self, status: int, record: RequestRecord) -> None:
        self._status = status
        self._handled = record

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        status, record = self._status, self._handled or RequestRecord()
        error_type = record.error_type
        if status is None:  # the handler never finished: cancelled, or the client went away
            status, error_type = 499, error_type or "cancelled"
        now = perf_counter()
        otel_context.detach(self._token)
        metrics, span = self._metrics, self._span
        metrics.in_flight.dec()
        try:
            span.set_attributes(self._attributes(status, record, error_type))
            # HTTP conventions: a refused request (4xx) is the caller's error, not the server's;
            # work cut short (499) and a stream that failed after its 200 are.
            if status >= 500 or status == 499 or (status < 400 and error_type is not None):
                span.set_status(Status(StatusCode.ERROR, error_type or f"HTTP {status}"))
            elif status < 400 and self._tally.model is not None:
                # An agent's run that answered, recovered or not: OK, as trace tools list runs (the
                # tool_calls counts say what went wrong on the way).
                span.set_status(Status(StatusCode.OK))
        finally:
            span.end()  # whatever the attributes did, the span is not lost
        if record.rounds is not None:
            metrics.tool_rounds.observe(record.rounds)
        if record.held_turn_lost:
            metrics.child(metrics.held_turns_lost, self._info.route).inc()
        metrics.request_series(self._info.route, status).answered(now - self._start, self._exemplar_trace, now)

    def _attributes(self, status: int, record: RequestRecord, error_type: str | None) -> dict[str, Any]:
        info = self._info
        attributes: dict[str, Any] = {
            names.ATTR_HTTP_METHOD: self._method, names.ATTR_HTTP_ROUTE: info.route,
            names.ATTR_URL_PATH: bounded(info.path, 512), names.ATTR_HTTP_STATUS: status}
        tally = self._tally
        # The trajectory, of a request that is part of one: it named one, or called the model or a
        # tool. An id minted for any other (a listing, an approval) would be a run of its own in the
        # trace tools' sessions and in the trajectory store.
        if record.trajectory_source != "new" or tally.model is not None or tally.outcomes:
            attributes[names.ATTR_CONVERSATION_ID] = record.trajectory_id or info.trajectory_id
        if record.principal is not None:
            attributes[names.ATTR_KEY_NAME] = record.principal
        if record.trajectory_source is not None:
            attributes[names.ATTR_TRAJECTORY_SOURCE] = record.trajectory_source
        if self._original_method is not None:
            attributes[names.ATTR_HTTP_METHOD_ORIGINAL] = self._original_method
        if error_type is not None or status >= 500:
            attributes[names.ATTR_ERROR_TYPE] = error_type or str(status)
        if record.rounds is not None:
            attributes[names.ATTR_ROUNDS] = record.rounds
            attributes[names.ATTR_ROUND_LIMIT_REACHED] = record.limit_reached
        if record.held_turn_lost:
            attributes[names.ATTR_HELD_TURN] = names.HELD_TURN_LOST
        if tally.model is not None:  # it called the provider: an agent's run, in the trace tools' words
            attributes.update(self._agent_attributes(tally.model, attributes[names.ATTR_CONVERSATION_ID]))
        return attributes

    def _agent_attributes(self, model: str, trajectory_id: str) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            names.ATTR_OPERATION_NAME: names.OPERATION_INVOKE_AGENT,
            names.ATTR_OPENINFERENCE_SPAN_KIND: names.SPAN_KIND_AGENT,
            names.ATTR_REQUEST_MODEL: model, names.ATTR_SESSION_ID: trajectory_id}
        attributes.update(self._tally.attributes())
        return attributes


class ChatSpan:
    """One `chat {model}` CLIENT span around one provider call (a whole stream, when streamed)."""

    __slots__ = ("_answer", "_attempt", "_capture", "_exemplar_trace", "_failure", "_fallback", "_metrics", "_model",
                 "_parent", "_principal", "_propagation", "_provider", "_resends", "_sent", "_span", "_start",
                 "_status", "_stream", "_tracer", "_trajectory", "_translation", "_upstream")

    def __init__(self, tracer: Tracer, metrics: Metrics, model: ChatModel, stream: bool, upstream: str,
                 provider: str, propagation: Propagation, capture: MessageCapture | None = None,
                 trajectory: str | None = None, principal: str | None = None) -> None:
        self._tracer = tracer
        self._trajectory = trajectory
        self._principal = principal
        self._capture = capture
        self._sent: tuple[MessageView, Mapping[str, Any]] | None = None
        self._metrics = metrics
        self._propagation = propagation
        self._model = model
        self._stream = stream
        self._upstream = upstream
        self._provider = provider
        self._fallback: tuple[str, str] | None = None  # the upstream this call moved on from, and why
        self._translation: tuple[str, tuple[str, ...]] | None = None  # the pair, and what was left out
        self._status: str | None = None
        self._answer: ModelAnswer | None = None
        self._failure: tuple[dict[str, Any], str] | None = None  # error attributes, status message
        self._attempt = 1  # of a provider call the gateway retried itself
        self._resends = 0  # of its request, on a new connection (the transport's, not the gateway's retry)

    def __enter__(self) -> ChatSpan:
        # Attributes are set when the span is recorded (the SDK's samplers do not read them).
        self._parent = parent = otel_context.get_current()  # the request's (its baggage too)
        self._span = span = self._tracer.start_span(self._model.span_name, context=parent, kind=SpanKind.CLIENT)
        if (tally := request_tally(parent)) is not None and tally.model is None:
            tally.model = self._model.request_model
        self._exemplar_trace = exemplar_trace_id(span, span.get_span_context())
        self._start = perf_counter()
        return self

    def inject(self, headers: dict[str, str]) -> None:
        self._propagation.inject_span(headers, self._span, self._parent)

    def sent(self, view: MessageView, body: Mapping[str, Any]) -> None:
        if self._capture is not None:
            self._sent = view, body

    def answered(self, answer: ModelAnswer) -> None:
        self._answer = answer
        self._status = "200"

    def failed(self, status: int | None, error_type: str, message: str) -> None:
        self._status = _status_label(status) if status is not None else "error"
        attributes: dict[str, Any] = {names.ATTR_ERROR_TYPE: bounded(error_type)}
        if status is not None:
            attributes[names.ATTR_HTTP_STATUS] = status
        self._failure = attributes, bounded(message, 1024)

    def retried(self, attempt: int) -> None:
        self._attempt = attempt
        self._metrics.upstream_retries.labels(self._model.label).inc()

    def resent(self) -> None:
        self._resends += 1

    def translated(self, pair: str, dropped: tuple[str, ...]) -> None:
        self._translation = pair, dropped
        self._metrics.translated_calls.labels(pair).inc()

    def fell_back(self, source: str, reason: str) -> None:
        self._fallback = source, reason
        self._metrics.upstream_fallbacks.labels(source, self._upstream, reason).inc()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None and self._status is None:  # cancelled or broken before an answer
            kind = type(exc).__name__ if isinstance(exc, Exception) else "cancelled"
            self.failed(None, kind, str(exc) or kind)
        now = perf_counter()
        span, failure, answer = self._span, self._failure, self._answer
        # The tokens, read once for the span and the metrics (each is a property of the answer).
        tokens = (answer.input_tokens, answer.output_tokens) if answer is not None else (None, None)
        try:
            attributes = self._attributes(*tokens)
            if self._capture is not None:
                attributes.update(self._content(self._capture))
            if failure is not None:
                attributes.update(failure[0])
                span.set_status(Status(StatusCode.ERROR, failure[1]))
            span.set_attributes(attributes)
        finally:
            span.end()  # whatever the attributes did, the span is not lost
        self._metrics.upstream_series(self._upstream, self._model.label, self._status or "error").answered(
            now - self._start, self._exemplar_trace, now, *tokens)

    def _content(self, capture: MessageCapture) -> dict[str, str]:
        """The messages sent and the answer (opt-in). Content the conversion cannot read is left
        out rather than failing the call it describes."""
        content: dict[str, str] = {}
        answer = self._answer
        try:
            if self._sent is not None:
                view, body = self._sent
                content.update(capture.request_attributes(view, body))
                if answer is not None:  # read as the request's API reads
                    content.update(capture.answer_attributes(view, answer.output, answer.finish_reason))
        except Exception:  # best effort: what describes a call must not fail it
            log.warning("chat span: message content not captured", exc_info=True)
        if (tally := request_tally(self._parent)) is not None:
            tally.content(content)
        return content

    def _route_attributes(self) -> dict[str, Any]:
        """How the call went where it went: translated, fallen back, retried, resent."""
        attributes: dict[str, Any] = {}
        if self._translation is not None:
            pair, dropped = self._translation
            attributes[names.ATTR_TRANSLATION] = pair
            if dropped:
                attributes[names.ATTR_TRANSLATION_DROPPED] = tuple(dict.fromkeys(dropped))
        if self._fallback is not None:
            attributes[names.ATTR_UPSTREAM_FALLBACK_FROM], attributes[names.ATTR_UPSTREAM_FALLBACK_REASON] = (
                self._fallback)
        if self._attempt > 1:
            attributes[names.ATTR_UPSTREAM_ATTEMPT] = self._attempt
        if self._resends:
            attributes[names.ATTR_HTTP_RESEND_COUNT] = self._resends
        return attributes

    def _attributes(self, input_tokens: int | None, output_tokens: int | None) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            names.ATTR_OPERATION_NAME: names.OPERATION_CHAT, names.ATTR_OPENINFERENCE_SPAN_KIND: names.SPAN_KIND_LLM,
            names.ATTR_PROVIDER_NAME: self._provider,
            names.ATTR_REQUEST_MODEL: self._model.request_model, names.ATTR_REQUEST_STREAM: self._stream,
            names.ATTR_UPSTREAM: self._upstream}
        if self._trajectory is not None:  # as the GenAI conventions put it on inference spans (Langfuse's sessions)
            attributes[names.ATTR_CONVERSATION_ID] = self._trajectory
            if self._principal is not None:  # with keys, a trajectory is the key's and the id's together
                attributes[names.ATTR_KEY_NAME] = self._principal
        if self._translation is not None or self._fallback is not None or self._attempt > 1 or self._resends:
            attributes.update(self._route_attributes())
        answer = self._answer
        if answer is None:
            return attributes
        # What the provider names (or echoes of the caller's request) is bounded like the caller's own;
        # each property read once.
        if (response_id := answer.response_id) is not None:
            attributes[names.ATTR_RESPONSE_ID] = bounded(str(response_id))
        if (model := answer.model) is not None:
            attributes[names.ATTR_RESPONSE_MODEL] = bounded(str(model))
        if (finish_reason := answer.finish_reason) is not None:
            attributes[names.ATTR_FINISH_REASONS] = (bounded(str(finish_reason)),)
        if input_tokens is not None:
            attributes[names.ATTR_INPUT_TOKENS] = input_tokens
        if output_tokens is not None:
            attributes[names.ATTR_OUTPUT_TOKENS] = output_tokens
        return attributes
