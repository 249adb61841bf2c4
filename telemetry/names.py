"""Every span name, attribute key, metric name and label of toolspan. Constants only: dashboards
and tests check their queries against this module."""

from typing import Final

# --- spans ------------------------------------------------------------------------------------
SPAN_TOOL_CALL: Final = "tool.call"
SPAN_TOOL_PARSE: Final = "tool.parse"
SPAN_TOOL_EXECUTE: Final = "tool.execute"

# --- attributes (OpenTelemetry GenAI conventions first, then toolspan's own) -------------------
ATTR_OPERATION_NAME: Final = "gen_ai.operation.name"
ATTR_TOOL_NAME: Final = "gen_ai.tool.name"
ATTR_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
ATTR_TOOL_TYPE: Final = "gen_ai.tool.type"
ATTR_TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
ATTR_CONVERSATION_ID: Final = "gen_ai.conversation.id"
ATTR_ERROR_TYPE: Final = "error.type"
ATTR_OUTCOME: Final = "toolspan.outcome"
ATTR_REJECTION_REASON: Final = "toolspan.rejection.reason"
ATTR_ARGS_MISSING: Final = "toolspan.args.missing"
ATTR_ARGS_UNRECOGNIZED: Final = "toolspan.args.unrecognized"
ATTR_ARGS_SUGGESTIONS: Final = "toolspan.args.suggestions"
ATTR_ROUND: Final = "toolspan.round"
ATTR_REQUEST_ID: Final = "toolspan.request.id"

OPERATION_EXECUTE_TOOL: Final = "execute_tool"
TOOL_TYPE_FUNCTION: Final = "function"

# --- metrics (exposition names, prefix toolspan_) ----------------------------------------------
METRIC_TOOL_CALLS: Final = "toolspan_tool_calls_total"
METRIC_TOOL_CALL_DURATION: Final = "toolspan_tool_call_duration_seconds"
METRIC_TOOL_REJECTIONS: Final = "toolspan_tool_rejections_total"

# --- labels and their bounded values ------------------------------------------------------------
LABEL_TOOL: Final = "tool"
LABEL_OUTCOME: Final = "outcome"
LABEL_REASON: Final = "reason"
EXEMPLAR_TRACE_ID: Final = "trace_id"

UNKNOWN_TOOL: Final = "__unknown__"  # every name outside the registry counts as this one
OUTCOMES: Final = ("ok", "error", "rejected", "timeout", "interrupted", "cancelled")
REJECTION_REASONS: Final = ("invalid_json", "missing_arguments", "parser", "unknown_tool", "not_allowed")
