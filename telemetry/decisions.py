"""Decision log records: what the gateway decided about a tool call, as OTLP log records beside its
spans, in the trace and span of the call's `tool.call` (a logs backend, Loki say, then joins a
record to its trace). The parse step allowed a call or denied it, and why; a reviewer was asked,
and allowed or denied it, and who; each guardrail decided on it (telemetry.guardrails). Off unless
OTEL_LOGS_EXPORTER names an exporter: nothing is made and nothing is spent on a call when it is off.

The GenAI conventions have proposed, not settled, how a decision is recorded (a log record, not a
span event), so the records are named under `toolspan.` (telemetry.names).

The Python logs SDK lives in `opentelemetry.sdk._logs`, and its API in `opentelemetry._logs`: the
only logs SDK there is, named as private while its specification is in development. Only what
those modules export is used (LoggerProvider, the batch processor, the exporters, LogRecord), the
same as for traces; the OpenTelemetry pins in pyproject.toml hold them to versions .ci/versions
tests at both ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry._logs import Logger, LogRecord, SeverityNumber
from opentelemetry.context import Context
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, ConsoleLogRecordExporter
from opentelemetry.sdk.resources import Resource

from gateway.tools import ToolCall, ToolOutcome, Turn
from gateway.tools.approvals import ApprovalDecision
from gateway.tools.hooks import Side
from telemetry import names
from telemetry.bounds import bounded
from telemetry.tracing import checked_signal_url, signal_url

_NAME_MAX = 128


def call_attributes(tool: str, call_id: str, turn: Turn) -> dict[str, Any]:
    """What every span and record of a tool call says of it: the tool, the call's id, the
    trajectory and the gateway key."""
    attributes: dict[str, Any] = {names.ATTR_TOOL_NAME: bounded(tool, _NAME_MAX),
                                  names.ATTR_TOOL_CALL_ID: bounded(call_id, _NAME_MAX)}
    if turn.trajectory_id is not None:
        attributes[names.ATTR_CONVERSATION_ID] = turn.trajectory_id
    if turn.principal is not None:
        attributes[names.ATTR_KEY_NAME] = turn.principal
    return attributes


class DecisionLog:
    """Writes the decision records through one OpenTelemetry logger. `context` is always the
    tool.call span's, which the record names."""

    def __init__(self, logger: Logger) -> None:
        self._logger = logger

    def _emit(self, context: Context, event: str, denied: bool, body: str, attributes: dict[str, Any]) -> None:
        severity = SeverityNumber.WARN if denied else SeverityNumber.INFO
        self._logger.emit(LogRecord(context=context, severity_number=severity, severity_text=severity.name,
                                    body=body, attributes=attributes, event_name=event))

    def parsed(self, context: Context, call: ToolCall, side: Side, turn: Turn, outcome: ToolOutcome) -> None:
        """The parse step's decision: the call went on (allow), or was refused (deny) and why."""
        attributes = call_attributes(call.name, call.id, turn)
        attributes[names.ATTR_TOOL_SIDE] = side
        rejection = outcome.rejection
        if rejection is None:
            attributes[names.ATTR_DECISION] = names.DECISION_ALLOW
            if outcome.unchecked is not None:
                attributes[names.ATTR_UNCHECKED_REASON] = outcome.unchecked
            self._emit(context, names.EVENT_TOOL_PARSE, False, f"{bounded(call.name, _NAME_MAX)}: allowed", attributes)
            return
        attributes[names.ATTR_DECISION] = names.DECISION_DENY
        attributes[names.ATTR_REJECTION_REASON] = rejection.reason
        self._emit(context, names.EVENT_TOOL_PARSE, True,
                   f"{bounded(call.name, _NAME_MAX)}: denied ({rejection.reason})", attributes)

    def asked(self, context: Context, call: ToolCall, turn: Turn, approval_id: str) -> None:
        """The call waits for a reviewer."""
        attributes = call_attributes(call.name, call.id, turn)
        attributes.update({names.ATTR_DECISION: names.DECISION_REQUIRE_APPROVAL, names.ATTR_APPROVAL_ID: approval_id})
        self._emit(context, names.EVENT_TOOL_APPROVAL, False,
                   f"{bounded(call.name, _NAME_MAX)}: waiting for approval", attributes)

    def decided(self, context: Context, call: ToolCall, turn: Turn, decision: ApprovalDecision,
                approval_id: str | None) -> None:
        """The reviewer's answer (or a timeout, a client gone, a shutdown: each a deny)."""
        allowed = decision.decision == "approve"
        attributes = call_attributes(call.name, call.id, turn)
        if approval_id is not None:
            attributes[names.ATTR_APPROVAL_ID] = approval_id
        attributes.update({names.ATTR_DECISION: names.DECISION_ALLOW if allowed else names.DECISION_DENY,
                           names.ATTR_TOOL_DECISION: decision.decision})
        if decision.by is not None:
            attributes[names.ATTR_DECIDED_BY] = decision.by
        by = f" by {decision.by}" if decision.by is not None else ""
        self._emit(context, names.EVENT_TOOL_APPROVAL, not allowed,
                   f"{bounded(call.name, _NAME_MAX)}: {decision.decision}{by}", attributes)

    def guarded(self, context: Context, attributes: dict[str, Any], denied: bool) -> None:
        """A guardrail's decision on a call (telemetry.guardrails): `attributes` are the call's and
        the decision's, as its span event has them; `denied`: a deny or a block."""
        self._emit(context, names.EVENT_TOOL_GUARDRAIL, denied,
                   f"{attributes.get(names.ATTR_TOOL_NAME)}: {attributes.get(names.ATTR_GUARDRAIL_DECISION)} by "
                   f"guardrail {attributes.get(names.ATTR_GUARDRAIL_NAME)} "
                   f"({attributes.get(names.ATTR_GUARDRAIL_MOMENT)} the call ran)", attributes)


def log_exporter_names(configured: str | None) -> tuple[str, ...]:
    """The exporters OTEL_LOGS_EXPORTER names (otlp, console or none). Unset means none: a trace
    backend (Phoenix, Langfuse, Jaeger, Tempo) takes no logs, and would refuse every export."""
    chosen = tuple(n.strip().lower() for n in (configured or "none").split(",") if n.strip())
    unknown = [n for n in chosen if n not in ("otlp", "console", "none")]
    if unknown:
        raise ValueError(f"OTEL_LOGS_EXPORTER={configured}: {', '.join(unknown)} is not supported "
                         "(use otlp, console or none)")
    return tuple(n for n in chosen if n != "none")


def logs_url(endpoint: str | None, logs_endpoint: str | None) -> str:
    """Where the records go: OTEL_EXPORTER_OTLP_LOGS_ENDPOINT as it is (refused when it ends in
    /v1/traces), else OTEL_EXPORTER_OTLP_ENDPOINT's /v1/logs."""
    return checked_signal_url("logs", logs_endpoint) if logs_endpoint else signal_url("logs", endpoint)


def build_decision_log(chosen: Sequence[str], logs_url: str, resource: Resource) -> tuple[LoggerProvider, DecisionLog]:
    """A logger provider of its own (never the global one) exporting in batches to the `chosen`
    exporters, and the decision log writing through it. The caller shuts the provider down."""
    provider = LoggerProvider(resource=resource)
    if "otlp" in chosen:
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter

        provider.add_log_record_processor(BatchLogRecordProcessor(OTLPLogExporter(endpoint=logs_url)))
    if "console" in chosen:
        provider.add_log_record_processor(BatchLogRecordProcessor(ConsoleLogRecordExporter()))
    return provider, DecisionLog(provider.get_logger(names.LOGGER_DECISIONS))
