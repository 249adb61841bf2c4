"""The object the gateway calls at each step: it opens the spans and moves the metrics."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from time import perf_counter, time_ns
from types import TracebackType
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer

from gateway.guardrails import GuardrailRecord
from gateway.instrumentation import PROBE_ROUTES, RequestInfo, RequestTrace, untraced
from gateway.settings.model import REDACT_KEYS
from gateway.state import StateUnavailable
from gateway.tools import Step, Tool, ToolCall, ToolOutcome, Turn
from gateway.tools.approvals import ApprovalDecision
from gateway.tools.hooks import ClientResult, Side
from gateway.tools.results import ToolOrigin
from telemetry import names
from telemetry.arguments import mask_message, render_arguments, secret_aliases
from telemetry.bounds import utf8
from telemetry.decisions import DecisionLog, call_attributes
from telemetry.guardrails import GuardrailTrail
from telemetry.labels import ModelLabels, NameLabels, ToolParameters
from telemetry.messages import MessageCapture
from telemetry.metrics import Metrics, encoder_for
from telemetry.outcomes import count_mended, names_found, outcome_attributes, outcome_label
from telemetry.propagation import Propagation, build_propagator
from telemetry.requests import ChatSpan, RequestSpan, exemplar_trace_id
from telemetry.tally import request_tally
from telemetry.trajectory import Retry, Trajectories

log = logging.getLogger("toolspan.telemetry")

_DESCRIPTION_MAX = 1024


@dataclass(frozen=True)
class ArgumentCapture:
    """Which raw arguments reach spans: rejections always, every call only when opted in."""

    record_all: bool = False
    max_chars: int = 2048
    redact_keys: Sequence[str] = REDACT_KEYS


class Telemetry:
    """Spans and metrics for every step the gateway reports: requests, provider calls, tool calls
    (the gateway's `Instrumentation`). `propagator` reads the callers' trace context and writes it
    into provider requests; by default W3C trace context and baggage. With `own_sampling`, a
    request is a root span the tracer's sampler decides on, linked to the caller's span, rather
    than a child of it (a caller's unsampled trace context cannot hide its tool calls)."""

    def __init__(self, tracer: Tracer, metrics: Metrics, capture: ArgumentCapture | None = None,
                 max_models: int = 50,
                 trajectories: Trajectories | None = None, propagator: TextMapPropagator | None = None,
                 max_label_chars: int = 128, own_sampling: bool = False,
                 messages: MessageCapture | None = None, count_probes: bool = False,
                 max_client_tools: int = 100, decisions: DecisionLog | None = None) -> None:
        self.tracer = tracer
        self.metrics = metrics
        self.capture = capture or ArgumentCapture()
        self.trajectories = trajectories if trajectories is not None else Trajectories()
        self._model_label = ModelLabels(max_models, max_label_chars)
        self._propagation = Propagation(propagator if propagator is not None else build_propagator())
        self._own_sampling = own_sampling
        self.messages = messages  # message content on the chat spans: None unless opted in
        self._uncounted = frozenset() if count_probes else PROBE_ROUTES  # routes with no span and no count
        self.client_tool_labels = NameLabels(max_client_tools, max_label_chars, names.OTHER_CLIENT_TOOL)
        self.decisions = decisions  # the decision log records: None unless a logs exporter is configured
        self.tool_parameters = ToolParameters()

    def tool_call(self, call: ToolCall, tool: Tool | None, turn: Turn, side: Side = "gateway") -> ToolCallSpan:
        return ToolCallSpan(self, call, tool, turn, side)

    def client_result(self, result: ClientResult, turn: Turn) -> None:
        """The client's execute step of one call: a `tool.execute` span (side client) in the request
        that brought the result, from the answer that handed the call over until now, and its time
        in the metrics."""
        now_ns = time_ns()
        sent_ns = int(result.sent_at * 1e9) if result.sent_at is not None else now_ns
        started_ns = min(sent_ns, now_ns)  # another replica's clock may run ahead
        outcome = "error" if result.error else names.OUTCOME_RETURNED
        label = self.client_tool_labels.label(result.tool)
        attributes = _call_attributes(result.tool, result.call_id, turn, names.SIDE_CLIENT)
        attributes.update({names.ATTR_OUTCOME: outcome, names.ATTR_RESULT_BYTES: result.size})
        span = self.tracer.start_span(names.SPAN_TOOL_EXECUTE, kind=SpanKind.INTERNAL, attributes=attributes,
                                      start_time=started_ns)
        if result.error:
            span.set_status(Status(StatusCode.ERROR, "the client's tool said the call failed"))
        if result.guardrails:  # what guardrails decided on the result, before the provider read it
            trail = GuardrailTrail()
            trail.add(result.guardrails, result.hidden, now_ns)
            trail.on_span(span)
            trail.count(self.metrics, label)
            if self.decisions is not None:
                trail.log(self.decisions, trace.set_span_in_context(span), result.tool, result.call_id, turn,
                          names.SIDE_CLIENT)
        span.end(end_time=now_ns)
        if result.sent_at is not None:
            self.metrics.client_tool_roundtrip.labels(label, outcome).observe((now_ns - started_ns) / 1e9)

    def mcp_server_state(self, server: str, up: bool, disconnected: bool) -> None:
        metrics = self.metrics
        metrics.child(metrics.mcp_server_up, server).set(1 if up else 0)
        if disconnected:
            metrics.child(metrics.mcp_server_disconnects, server).inc()

    def inject_context(self, carrier: dict[str, str]) -> None:
        self._propagation.inject(carrier, otel_context.get_current())

    def request(self, info: RequestInfo) -> RequestSpan | AbstractContextManager[RequestTrace]:
        if info.route in self._uncounted:  # a probe (gateway.instrumentation.PROBE_ROUTES)
            return untraced(info)
        return RequestSpan(self.tracer, self.metrics, info, self._propagation, self._own_sampling)

    def chat(self, model: str, stream: bool, upstream: str, provider: str, trajectory: str | None = None,
             principal: str | None = None) -> ChatSpan:
        return ChatSpan(self.tracer, self.metrics, self._model_label.chat_model(model), stream, upstream, provider,
                        self._propagation, self.messages, trajectory, principal)

    def upstream_state(self, upstream: str, up: bool) -> None:
        self.metrics.child(self.metrics.upstream_up, upstream).set(1 if up else 0)

    def limit_refused(self, key: str, limit: str) -> None:
        self.metrics.child(self.metrics.limit_refusals, key or names.NO_KEY, limit).inc()

    def limit_usage(self, key: str, limit: str, used: int, bound: int) -> None:
        metrics = self.metrics
        metrics.child(metrics.limit_usage, key or names.NO_KEY, limit).set(used)
        metrics.child(metrics.limit_bound, key or names.NO_KEY, limit).set(bound)

    def limits_unavailable(self) -> None:
        self.metrics.limits_unavailable.inc()

    def exposition(self, accept: str | None) -> tuple[bytes, str]:
        """The metrics, as OpenMetrics (with exemplars) when the scraper asks for it."""
        encoder, content_type = encoder_for(accept)
        return encoder(self.metrics.registry), content_type


def _origin_attributes(origin: ToolOrigin) -> dict[str, Any]:
    """What a tool.call span says of the MCP server behind a tool."""
    attributes: dict[str, Any] = {names.ATTR_MCP_METHOD_NAME: origin.method, names.ATTR_MCP_SERVER: origin.server,
                                  names.ATTR_MCP_TOOL_NAME: origin.remote_name,
                                  names.ATTR_NETWORK_TRANSPORT: origin.transport}
    if origin.protocol_version is not None:
        attributes[names.ATTR_MCP_PROTOCOL_VERSION] = origin.protocol_version
    return attributes


def _call_attributes(tool: str, call_id: str, turn: Turn, side: str) -> dict[str, Any]:
    """What every span of a tool call says of it: the GenAI tool attributes, its side, its trajectory
    and the gateway key."""
    attributes = call_attributes(tool, call_id, turn)
    attributes.update({names.ATTR_OPERATION_NAME: names.OPERATION_EXECUTE_TOOL,
                       names.ATTR_TOOL_TYPE: names.TOOL_TYPE_FUNCTION, names.ATTR_TOOL_SIDE: side})
    return attributes


class ToolCallSpan:
    """One `tool.call` span, current while the call runs; ends and counts exactly once. Of a
    client tool's call (`side="client"`), the span is the gateway's check of its arguments."""

    __slots__ = ("_approval_id", "_call", "_context", "_exemplar_trace", "_inst", "_label", "_origin", "_outcome",
                 "_retry", "_side", "_span", "_start", "_tool", "_trail", "_turn", "_waiting")

    def __init__(self, inst: Telemetry, call: ToolCall, tool: Tool | None, turn: Turn, side: Side = "gateway") -> None:
        self._inst = inst
        self._call = call
        self._side = side
        if side == "client":
            self._label = inst.client_tool_labels.label(call.name)
        else:
            self._label = tool.name if tool is not None else names.UNKNOWN_TOOL
        self._tool = tool
        self._origin = tool.origin if tool is not None else None
        self._turn = turn
        self._outcome: ToolOutcome | None = None
        self._waiting = False  # for a reviewer's approval, counted in the pending gauge
        self._approval_id: str | None = None  # the approval it asked for, if any
        self._trail: GuardrailTrail | None = None  # what guardrails decided on it, if any did

    async def __aenter__(self) -> ToolCallSpan:
        call, turn = self._call, self._turn
        attributes = _call_attributes(call.name, call.id, turn, self._side)
        attributes[names.ATTR_ROUND] = turn.round
        attributes[names.ATTR_OPENINFERENCE_SPAN_KIND] = names.SPAN_KIND_TOOL
        attributes[names.ATTR_OI_TOOL_NAME] = attributes[names.ATTR_TOOL_NAME]
        if self._tool is not None:
            attributes[names.ATTR_OI_TOOL_PARAMETERS] = self._inst.tool_parameters.of(self._tool)
        if self._origin is not None:
            attributes.update(_origin_attributes(self._origin))
        # Retries are tracked per gateway key, under the metric's tool label: names outside the
        # registry (a model can invent any, of any length) are all one.
        # Whichever replica ran the failed call: a shared store that cannot answer leaves the call
        # unclassified, said on the span, rather than holding the call up.
        try:
            retry = await self._inst.trajectories.classify(turn.trajectory_id, self._label, call.arguments,
                                                           principal=turn.principal)
        except StateUnavailable:
            retry = None
            attributes[names.ATTR_RETRY_STATE] = "unavailable"
        self._retry = retry
        links: tuple[Link, ...] = ()
        if retry is not None:
            failed = retry.retries
            attributes[names.ATTR_RETRY_KIND] = retry.kind
            attributes[names.ATTR_RETRY_OF_SPAN_ID] = "%016x" % failed.span_id  # noqa: UP031  # as traces print ids
            attributes[names.ATTR_RETRY_OF_TRACE_ID] = "%032x" % failed.trace_id  # noqa: UP031
            links = (Link(failed, {names.ATTR_RETRY_KIND: retry.kind}),)
        self._span = self._inst.tracer.start_span(
            names.SPAN_TOOL_CALL, kind=SpanKind.INTERNAL, attributes=attributes, links=links)
        # Not made current itself: the steps name it as their parent, and the execute step is
        # what the tool body runs under.
        self._context = trace.set_span_in_context(self._span)
        self._exemplar_trace = exemplar_trace_id(self._span, self._span.get_span_context())
        self._start = perf_counter()
        return self

    def step(self, name: Step) -> StepSpan:
        # Only the execute step becomes current: spans the tool body opens belong under it.
        if name == "parse":
            return StepSpan(self._inst.tracer, names.SPAN_TOOL_PARSE, self._context, current=False)
        return StepSpan(self._inst.tracer, names.SPAN_TOOL_EXECUTE, self._context, current=True)

    def finish(self, outcome: ToolOutcome) -> None:
        self._outcome = outcome

    def asked(self, approval_id: str) -> None:
        self._approval_id = approval_id
        self._span.set_attribute(names.ATTR_APPROVAL_ID, approval_id)
        self._span.add_event(names.EVENT_TOOL_DECISION, {names.ATTR_EVENT_DECISION: names.DECISION_REQUIRE_APPROVAL})
        self._inst.metrics.approvals_pending.inc()
        self._waiting = True
        if self._inst.decisions is not None:
            self._inst.decisions.asked(self._context, self._call, self._turn, approval_id)

    def decided(self, decision: ApprovalDecision) -> None:
        if self._waiting:
            self._inst.metrics.approvals_pending.dec()
            self._waiting = False
        said = names.DECISION_ALLOW if decision.decision == "approve" else names.DECISION_DENY
        self._span.add_event(names.EVENT_TOOL_DECISION, {names.ATTR_EVENT_DECISION: said})
        attributes: dict[str, Any] = {names.ATTR_TOOL_DECISION: decision.decision,
                                      names.ATTR_APPROVAL_WAIT_MS: round(decision.waited_seconds * 1000, 3)}
        if decision.by is not None:
            attributes[names.ATTR_DECIDED_BY] = decision.by
        self._span.set_attributes(attributes)
        if self._inst.decisions is not None:
            self._inst.decisions.decided(self._context, self._call, self._turn, decision, self._approval_id)
        metrics = self._inst.metrics
        metrics.approval_decisions.labels(self._label, decision.decision).inc()
        metrics.approval_wait.labels(self._label, decision.decision).observe(decision.waited_seconds)

    def guarded(self, records: Sequence[GuardrailRecord], hidden: Sequence[str]) -> None:
        """Kept until the call ends (telemetry.guardrails), then recorded with its hidden values masked."""
        if self._trail is None:
            self._trail = GuardrailTrail()
        self._trail.add(records, hidden)

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        now = perf_counter()
        span = self._span
        try:
            outcome_label = self._record(span)
        finally:
            span.end()
        outcome = self._outcome
        if (tally := request_tally()) is not None:
            retried = self._retry is not None
            tally.counted(outcome_label, retried, retried and outcome is not None and outcome.status == "ok")
        if outcome is not None and self._inst.decisions is not None:
            self._inst.decisions.parsed(self._context, self._call, self._side, self._turn, outcome)
        metrics = self._inst.metrics
        if self._trail is not None:
            self._trail.count(metrics, self._label)
            if self._inst.decisions is not None:
                self._trail.log(self._inst.decisions, self._context, self._call.name, self._call.id, self._turn,
                                self._side)
        metrics.tool_calls.labels(self._label, outcome_label, self._side).inc()
        if self._side == "gateway":  # a client call's time is the client's (its check is the gateway's, and brief)
            metrics.tool_call_duration.labels(self._label, outcome_label).observe(now - self._start,
                                                                                 self._exemplar_trace, now)
        if outcome is not None and outcome.rejection is not None:
            metrics.tool_rejections.labels(self._label, outcome.rejection.reason, self._side).inc()
        if outcome is not None and outcome.unchecked is not None:
            metrics.tool_unchecked.labels(self._label, outcome.unchecked, self._side).inc()
        if outcome is not None and (outcome.aliases or outcome.repair is not None):
            count_mended(self._inst.metrics, self._label, outcome)
        if outcome is not None:
            self._count_retry(outcome, self._retry)
            # Last: the span and the counts are in whatever happens to this write (a shared store
            # that is slow, a request cancelled meanwhile).
            await self._remember(outcome, span)

    async def _remember(self, outcome: ToolOutcome, span: Span) -> None:
        try:
            await self._inst.trajectories.record(self._turn.trajectory_id, self._label, self._call.arguments,
                                                 span.get_span_context(), outcome.failed, self._retry,
                                                 principal=self._turn.principal)
        except StateUnavailable:  # counted by the store; the next retry of this call goes unclassified
            log.debug("retry state of %s not written: the state store is unavailable", self._label)

    def _count_retry(self, outcome: ToolOutcome, retry: Retry | None) -> None:
        metrics = self._inst.metrics
        if retry is not None:
            metrics.tool_retries.labels(self._label, retry.kind, self._side).inc()
            if outcome.status == "ok":
                metrics.tool_recoveries.labels(self._label, retry.kind, self._side).inc()

    def _record(self, span: Span) -> str:
        outcome, trail = self._outcome, self._trail
        if trail is not None:
            trail.on_span(span)
        if outcome is None:  # the call was cancelled (client gone) or the gateway failed
            span.set_attributes({names.ATTR_OUTCOME: "cancelled", names.ATTR_ERROR_TYPE: "cancelled"})
            span.set_status(Status(StatusCode.ERROR, "the tool call did not finish"))
            return "cancelled"
        capture = self._inst.capture
        label = outcome_label(outcome)
        redact = capture.redact_keys if self._tool is None else secret_aliases(self._tool.alias_of, capture.redact_keys)
        attributes = outcome_attributes(outcome, label, capture.max_chars, redact,
                                        None if trail is None else trail.hide_arguments)
        # A retry's arguments too: set beside the failed call's, they are what the model changed.
        if outcome.rejection is not None or capture.record_all or self._retry is not None:
            raw = self._call.arguments if trail is None else trail.hide_arguments(self._call.arguments)
            arguments = utf8(render_arguments(raw, capture.max_chars, redact))
            attributes.update({names.ATTR_TOOL_CALL_ARGUMENTS: arguments, names.ATTR_INPUT_VALUE: arguments,
                               names.ATTR_INPUT_MIME_TYPE: names.MIME_JSON})
        # What the model got back: the diagnostic of a failed call always, any result when opted in.
        result = (self._result(outcome, capture.max_chars, trail, redact) if outcome.failed or capture.record_all
                  else None)
        if result is not None:
            attributes.update({names.ATTR_TOOL_CALL_RESULT: result, names.ATTR_OUTPUT_VALUE: result,
                               names.ATTR_OUTPUT_MIME_TYPE: names.MIME_TEXT})
        span.set_attributes(attributes)
        if outcome.failed:
            span.set_status(Status(StatusCode.ERROR, self._description(outcome, result or "", trail)))
        return label

    def _result(self, outcome: ToolOutcome, max_chars: int, trail: GuardrailTrail | None,
                redact: Sequence[str]) -> str:
        """The model-facing content, bounded, with the secrets of the arguments and the values
        guardrails hid masked: a rejection may quote a rejected value, a tool's error may quote its
        arguments."""
        capture = self._inst.capture
        text = outcome.content_text() if trail is None else trail.hide(outcome.content_text())
        # Masked before the final cut, so that a secret is not cut in half and missed.
        message = mask_message(text[: 4 * max_chars], self._call.arguments, redact, capture.max_chars)
        return utf8(message[:max_chars])

    @staticmethod
    def _description(outcome: ToolOutcome, result: str, trail: GuardrailTrail | None) -> str:
        """The status description: a first line that says why (the reason, and what the name check
        found, the guardrail that stopped the call, or the message's own first line), then the
        model-facing message (`result`), its line breaks kept, for the trace tools that show only
        the status."""
        reason = outcome.rejection.reason if outcome.rejection is not None else outcome.error_type or outcome.status
        found = names_found(outcome.names) if outcome.names is not None else ""
        if trail is not None:
            found = found or trail.headline()
        first_line = result.split("\n", 1)[0].strip()
        headline = f"{reason}: {found or first_line}"
        return utf8(f"{headline}\n\n{result}"[:_DESCRIPTION_MAX])


class StepSpan:
    """A child span for one step; cheaper than the SDK's generator-based helper, and this runs
    twice on every call."""

    __slots__ = ("_current", "_name", "_parent", "_span", "_token", "_tracer")

    def __init__(self, tracer: Tracer, name: str, parent: otel_context.Context, current: bool) -> None:
        self._tracer = tracer
        self._name = name
        self._parent = parent
        self._current = current
        self._token: object | None = None

    def __enter__(self) -> None:
        self._span = self._tracer.start_span(self._name, context=self._parent)
        if self._current:
            self._token = otel_context.attach(trace.set_span_in_context(self._span, self._parent))

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._span.end()
        if self._token is not None:
            otel_context.detach(self._token)  # type: ignore[arg-type]
