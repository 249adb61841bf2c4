"""Every span name, attribute key, metric name and label of toolspan. Constants only: dashboards
and tests check their queries against this module."""

from typing import Final, get_args

from gateway.state import StateKind
from gateway.tools.approvals import Decided
from gateway.tools.hooks import Side
from gateway.tools.results import RejectionReason, Status
from telemetry.trajectory import RetryKind

# --- spans ------------------------------------------------------------------------------------
SPAN_TOOL_CALL: Final = "tool.call"
SPAN_TOOL_PARSE: Final = "tool.parse"
SPAN_TOOL_EXECUTE: Final = "tool.execute"

SPAN_CHAT_PREFIX: Final = "chat"  # "chat {model}"

# --- attributes (OpenTelemetry GenAI conventions first, then toolspan's own) -------------------
ATTR_OPERATION_NAME: Final = "gen_ai.operation.name"
ATTR_TOOL_NAME: Final = "gen_ai.tool.name"
ATTR_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
ATTR_TOOL_TYPE: Final = "gen_ai.tool.type"
ATTR_TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
ATTR_CONVERSATION_ID: Final = "gen_ai.conversation.id"
# The name (never the secret) of the gateway key that sent the request: with keys, a trajectory is
# the key's and the id's together, so that two keys sending one X-Trajectory-Id never share one.
ATTR_KEY_NAME: Final = "toolspan.key.name"
ATTR_ERROR_TYPE: Final = "error.type"
ATTR_OUTCOME: Final = "toolspan.outcome"
# On a tool.call span: "gateway" (a tool the gateway ran) or "client" (a call of the client's own
# tool, checked by the gateway and handed to the client: the span is its parse step).
ATTR_TOOL_SIDE: Final = "toolspan.tool.side"
# Why the gateway did not check a client call (outcome "unchecked"): schema_too_large, too_many_tools,
# invalid_schema, not_a_function, remote_ref (its schema refers to something outside itself) or
# too_complex (checking it would cost more than its budget). On a gateway tool's call (an MCP tool's,
# validate_schema) whatever its outcome: why its values were not checked before the body ran
# (remote_ref, too_complex, invalid_schema), the names having been.
ATTR_UNCHECKED_REASON: Final = "toolspan.tool.unchecked_reason"
# On a client call's execute step (a `tool.execute` span, side client): the bytes of the result the
# client sent back. The span itself runs from the answer that handed the call over to the request
# that brought the result: the client's tool time plus its own overhead.
ATTR_RESULT_BYTES: Final = "toolspan.tool.result_bytes"
OUTCOME_RETURNED: Final = "returned"  # a client call's result came back, and nothing says it failed
ATTR_REJECTION_REASON: Final = "toolspan.rejection.reason"
ATTR_ARGS_MISSING: Final = "toolspan.args.missing"
ATTR_ARGS_UNRECOGNIZED: Final = "toolspan.args.unrecognized"
ATTR_ARGS_SUGGESTIONS: Final = "toolspan.args.suggestions"
# The parameter aliases a call's arguments used, as "alias->parameter" (gateway.tools.aliases).
ATTR_ARGS_ALIASES: Final = "toolspan.args.aliases"
# What argument repair found for a call (gateway.tools.repair): the mode it ran in (observe: recorded,
# the call rejected; apply: the call ran on the repaired arguments, outcome repaired), the changes
# ("rename file_path -> path", "type a: string -> integer", "wrap tags in an array") and the
# arguments before and after, as JSON, redacted and bounded as gen_ai.tool.call.arguments is.
ATTR_REPAIR_MODE: Final = "toolspan.repair.mode"
ATTR_REPAIR_CHANGES: Final = "toolspan.repair.changes"
ATTR_REPAIR_BEFORE: Final = "toolspan.repair.before"
ATTR_REPAIR_AFTER: Final = "toolspan.repair.after"
REPAIR_OBSERVE: Final = "observe"
REPAIR_APPLY: Final = "apply"
OUTCOME_REPAIRED: Final = "repaired"  # a call whose arguments were repaired, that then ran and returned
ATTR_ROUND: Final = "toolspan.round"
ATTR_RETRY_KIND: Final = "toolspan.retry.kind"
# "unavailable": the shared retry state could not be read for this call (Redis down): it is unclassified
ATTR_RETRY_STATE: Final = "toolspan.retry.state"
# On a `chat` span: which attempt of its provider call it is (2 and up: the gateway retried it).
ATTR_UPSTREAM_ATTEMPT: Final = "toolspan.upstream.attempt"
# The configured upstream a chat span's call went to (issue 55), and when the call moved on to it
# after another failed before answering: which one, and why (FALLBACK_REASONS).
ATTR_UPSTREAM: Final = "toolspan.upstream"
ATTR_UPSTREAM_FALLBACK_FROM: Final = "toolspan.upstream.fallback.from"
ATTR_UPSTREAM_FALLBACK_REASON: Final = "toolspan.upstream.fallback.reason"
# A provider call made in another API than its client's (issue 56): the pair (messages->chat), and
# what of the client's request could not be said in the provider's API and was left out.
ATTR_TRANSLATION: Final = "toolspan.translation"
ATTR_TRANSLATION_DROPPED: Final = "toolspan.translation.dropped"
# On a `chat` span: how many times its request was sent again on a new connection, the kept-alive one
# having closed unanswered (the HTTP conventions' attribute, stable; absent: sent once).
ATTR_HTTP_RESEND_COUNT: Final = "http.request.resend_count"

ATTR_PROVIDER_NAME: Final = "gen_ai.provider.name"
ATTR_REQUEST_MODEL: Final = "gen_ai.request.model"
ATTR_REQUEST_STREAM: Final = "gen_ai.request.stream"
ATTR_RESPONSE_ID: Final = "gen_ai.response.id"
ATTR_RESPONSE_MODEL: Final = "gen_ai.response.model"
ATTR_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
ATTR_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
ATTR_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
ATTR_HTTP_METHOD: Final = "http.request.method"
ATTR_HTTP_METHOD_ORIGINAL: Final = "http.request.method_original"  # when the method is none of HTTP_METHODS
ATTR_HTTP_ROUTE: Final = "http.route"
ATTR_HTTP_STATUS: Final = "http.response.status_code"
ATTR_URL_PATH: Final = "url.path"
ATTR_ROUNDS: Final = "toolspan.rounds"
# A tool an MCP server serves: the MCP conventions' method, protocol version and transport, and
# which configured server and which of its tools (gen_ai.tool.name is the name the model used).
ATTR_MCP_METHOD_NAME: Final = "mcp.method.name"
ATTR_MCP_PROTOCOL_VERSION: Final = "mcp.protocol.version"
ATTR_NETWORK_TRANSPORT: Final = "network.transport"
ATTR_MCP_SERVER: Final = "toolspan.mcp.server"
ATTR_MCP_TOOL_NAME: Final = "toolspan.mcp.tool.name"
ATTR_ROUND_LIMIT_REACHED: Final = "toolspan.round_limit_reached"
# On a request span that ran the tool loop: its tool.call spans counted, in all (`.total`) and by
# outcome (`.rejected`, ...: OUTCOMES, set when nonzero), and the retries of failed calls among them
# (`.retried`), of which `.recovered` succeeded. A trace tool filters requests by these, the request
# itself staying OK when it recovered. Each is this prefix and a suffix: no count's key is a prefix
# of another's, which backends that nest dotted keys (Phoenix) could not hold.
ATTR_TOOL_CALLS_PREFIX: Final = "toolspan.tool_calls."
TOOL_CALLS_TOTAL: Final = "total"
TOOL_CALLS_RETRIED: Final = "retried"
TOOL_CALLS_RECOVERED: Final = "recovered"
# On a retry's tool.call span, besides its link: the failed call's span, by its ids in hex, for trace
# tools that show no links (Phoenix).
ATTR_RETRY_OF_SPAN_ID: Final = "toolspan.retry.of.span_id"
ATTR_RETRY_OF_TRACE_ID: Final = "toolspan.retry.of.trace_id"
# The result the model got from a call (a tool's result, or the diagnostic of a rejection), as the
# GenAI conventions name it (opt-in there; here on failed calls always, every call with
# record_tool_arguments).
ATTR_TOOL_CALL_RESULT: Final = "gen_ai.tool.call.result"
# A call that waited for a reviewer (gateway.tools.approvals): the approval's id, what was decided
# (approve, deny, timeout, cancelled, shutdown), the gateway key that decided, and the wait.
ATTR_APPROVAL_ID: Final = "toolspan.approval.id"
ATTR_TOOL_DECISION: Final = "toolspan.tool.decision"
ATTR_DECIDED_BY: Final = "toolspan.tool.decided_by"
ATTR_APPROVAL_WAIT_MS: Final = "toolspan.approval.wait_ms"
# A span event of the tool.call span, as the proposed GenAI convention names it: require_approval when
# the call starts to wait, then allow or deny (a timeout, a client gone, a shutdown: deny).
EVENT_TOOL_DECISION: Final = "gen_ai.tool.call.decision"
ATTR_EVENT_DECISION: Final = "gen_ai.tool.call.decision"
DECISION_REQUIRE_APPROVAL: Final = "require_approval"
DECISION_ALLOW: Final = "allow"
DECISION_DENY: Final = "deny"
# Guardrails (gateway.guardrails), on a tool.call span and on a client call's execute step: the
# guardrail whose decision stands (the strongest of the call's, GUARDRAIL_STRENGTH; of equals, the
# later; all allowed: the last of the chain), its decision, reason and moment (before the call runs,
# after: on its result). Each decision, allow included, is an event of the span too, with the same
# attributes and, of a guardrail that raised or timed out, how it failed. No key is a prefix of
# another: Phoenix nests dotted keys.
ATTR_GUARDRAIL_NAME: Final = "toolspan.guardrail.name"
ATTR_GUARDRAIL_DECISION: Final = "toolspan.guardrail.decision"
ATTR_GUARDRAIL_REASON: Final = "toolspan.guardrail.reason"
ATTR_GUARDRAIL_MOMENT: Final = "toolspan.guardrail.moment"
ATTR_GUARDRAIL_FAILED: Final = "toolspan.guardrail.failed"
EVENT_GUARDRAIL: Final = "toolspan.guardrail"
# What a guardrail's hidden values (a credential it found) become in whatever is recorded of the call.
GUARDRAIL_HIDDEN_MASK: Final = "[REDACTED]"
# The error type of a call whose result a guardrail withheld (outcome error); a call a guardrail
# denied is rejected, for the reason guardrail_denied (REJECTION_REASONS).
ERROR_GUARDRAIL_BLOCKED: Final = "guardrail_blocked"
# A request continuing a turn the gateway no longer held (expired, pushed out, lost in a restart):
# "lost", and the model saw the client's copy of the conversation, without the gateway's rounds.
ATTR_HELD_TURN: Final = "toolspan.held_turn"
# On a request span: how its trajectory was found (gateway.linking): header, metadata, previous_response,
# call_ids, session_header or new.
ATTR_TRAJECTORY_SOURCE: Final = "toolspan.trajectory.source"
HELD_TURN_LOST: Final = "lost"
# Message content (GenAI conventions; opt-in): the chat history sent and the model's answer, as JSON.
ATTR_INPUT_MESSAGES: Final = "gen_ai.input.messages"
ATTR_OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
ATTR_SYSTEM_INSTRUCTIONS: Final = "gen_ai.system_instructions"  # instructions sent apart from the history
# The tools offered to the model in the call (with message content only), as JSON: the conventions'
# tool definitions, `[{"type", "name", "description", "parameters"}]`.
ATTR_TOOL_DEFINITIONS: Final = "gen_ai.tool.definitions"

# OpenInference, which Arize Phoenix reads: what a span is (its kind), its input and output as text
# with their MIME type, a tool's name and parameters (its JSON Schema), the session (the trajectory).
ATTR_OPENINFERENCE_SPAN_KIND: Final = "openinference.span.kind"
ATTR_INPUT_VALUE: Final = "input.value"
ATTR_INPUT_MIME_TYPE: Final = "input.mime_type"
ATTR_OUTPUT_VALUE: Final = "output.value"
ATTR_OUTPUT_MIME_TYPE: Final = "output.mime_type"
ATTR_OI_TOOL_NAME: Final = "tool.name"
ATTR_OI_TOOL_PARAMETERS: Final = "tool.parameters"
ATTR_SESSION_ID: Final = "session.id"
SPAN_KIND_AGENT: Final = "AGENT"
SPAN_KIND_LLM: Final = "LLM"
SPAN_KIND_TOOL: Final = "TOOL"
MIME_JSON: Final = "application/json"
MIME_TEXT: Final = "text/plain"

# --- log records (OTLP logs beside the spans; off unless OTEL_LOGS_EXPORTER names an exporter) ---
# A decision the gateway took on a tool call, in the trace and span of its tool.call: its parse step
# allowed the call or denied it (with toolspan.rejection.reason), or a reviewer was asked and then
# allowed or denied it (toolspan.tool.decision, toolspan.tool.decided_by). Named under toolspan.
# until the GenAI conventions settle on decision records.
EVENT_TOOL_PARSE: Final = "toolspan.tool.parse"
EVENT_TOOL_APPROVAL: Final = "toolspan.tool.approval"
ATTR_DECISION: Final = "toolspan.decision"
# A guardrail's decision on a tool call, one record each (allow included), with the attributes of its
# span event; WARN for deny and block.
EVENT_TOOL_GUARDRAIL: Final = "toolspan.tool.guardrail"
LOGGER_DECISIONS: Final = "toolspan.decisions"  # the instrumentation scope of the decision records

# The HTTP conventions' methods; any other is "_OTHER" on the span, and "HTTP" in its name.
HTTP_METHODS: Final = frozenset({"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"})
HTTP_METHOD_OTHER: Final = "_OTHER"
SPAN_HTTP_OTHER: Final = "HTTP"

OPERATION_CHAT: Final = "chat"
OPERATION_EXECUTE_TOOL: Final = "execute_tool"
OPERATION_INVOKE_AGENT: Final = "invoke_agent"  # a request that ran the tool loop: an agent's run
TOOL_TYPE_FUNCTION: Final = "function"

# --- metrics (exposition names, prefix toolspan_) ----------------------------------------------
METRIC_TOOL_CALLS: Final = "toolspan_tool_calls_total"
METRIC_TOOL_CALL_DURATION: Final = "toolspan_tool_call_duration_seconds"
METRIC_TOOL_REJECTIONS: Final = "toolspan_tool_rejections_total"
METRIC_TOOL_RETRIES: Final = "toolspan_tool_retries_total"
METRIC_TOOL_RECOVERIES: Final = "toolspan_tool_recoveries_total"
# Calls whose arguments were not checked against their tool's schema, by tool, reason (the span's
# toolspan.tool.unchecked_reason) and side.
METRIC_TOOL_UNCHECKED: Final = "toolspan_tool_unchecked_total"
# Parameter aliases used by calls of the gateway's tools, by tool and parameter (the alias's).
METRIC_TOOL_ALIASES_USED: Final = "toolspan_tool_aliases_used_total"
# Calls whose arguments repair found a sure fix for, by tool and mode (observe, apply).
METRIC_TOOL_REPAIRS: Final = "toolspan_tool_repairs_total"
# From the answer that handed a client call over to the request that brought its result: the client's
# tool time plus its own overhead, by tool and outcome (returned or error).
METRIC_CLIENT_TOOL_ROUNDTRIP: Final = "toolspan_client_tool_roundtrip_seconds"
METRIC_UPSTREAM_REQUESTS: Final = "toolspan_upstream_requests_total"
METRIC_UPSTREAM_DURATION: Final = "toolspan_upstream_request_duration_seconds"
# Provider calls the gateway tried again itself, after gateway tools ran (gateway.engine.retries).
METRIC_UPSTREAM_RETRIES: Final = "toolspan_upstream_retries_total"
# Provider calls that moved from one upstream to another, by from, to and reason (a status, timeout,
# connection); and each upstream's state: 1 in its routes, 0 cooling down after failures.
METRIC_UPSTREAM_FALLBACKS: Final = "toolspan_upstream_fallbacks_total"
METRIC_UPSTREAM_UP: Final = "toolspan_upstream_up"
# Gateway keys' limits (gateway.limits): refusals by key and limit; what a key has used of a limit
# and the limit itself, as last checked in this process; checks that could not be made (Redis down).
METRIC_LIMIT_REFUSALS: Final = "toolspan_limit_refusals_total"
METRIC_LIMIT_USAGE: Final = "toolspan_limit_usage"
METRIC_LIMIT_BOUND: Final = "toolspan_limit_bound"
METRIC_LIMITS_UNAVAILABLE: Final = "toolspan_limit_state_unavailable_total"
LABEL_KEY: Final = "key"  # a configured gateway key's name (NO_KEY without keys)
LABEL_LIMIT: Final = "limit"  # of the limit metrics: gateway.limits.gate.LimitName
NO_KEY: Final = "__none__"
# Provider calls made in another API than their client's, by pair (messages->chat).
METRIC_TRANSLATED_CALLS: Final = "toolspan_translated_calls_total"
METRIC_TOKENS: Final = "toolspan_tokens_total"
METRIC_REQUESTS: Final = "toolspan_requests_total"
METRIC_REQUEST_DURATION: Final = "toolspan_request_duration_seconds"
METRIC_REQUESTS_IN_FLIGHT: Final = "toolspan_requests_in_flight"
METRIC_TOOL_ROUNDS: Final = "toolspan_tool_rounds"
METRIC_MCP_SERVER_UP: Final = "toolspan_mcp_server_up"
METRIC_MCP_SERVER_DISCONNECTS: Final = "toolspan_mcp_server_disconnects_total"
METRIC_TRAJECTORY_STORE_DROPPED: Final = "toolspan_trajectory_store_dropped_total"
# Exported only with a shared state store (state_url, Redis): no series means none is configured.
METRIC_STATE_STORE_UP: Final = "toolspan_state_store_up"
METRIC_STATE_STORE_FAILURES: Final = "toolspan_state_store_failures_total"
METRIC_STATE_STORE_LOSSES: Final = "toolspan_state_store_losses_total"
METRIC_STATE_STORE_UNREADABLE: Final = "toolspan_state_store_unreadable_total"
METRIC_HELD_TURNS_LOST: Final = "toolspan_held_turns_lost_total"
# Approvals (gateway.tools.approvals): calls waiting for a reviewer now; decisions by tool and
# decision (DECISIONS); the wait, by the same.
METRIC_APPROVALS_PENDING: Final = "toolspan_approvals_pending"
METRIC_APPROVAL_DECISIONS: Final = "toolspan_approval_decisions_total"
METRIC_APPROVAL_WAIT: Final = "toolspan_approval_wait_seconds"
# Guardrails' decisions, by guardrail, tool and decision (GUARDRAIL_DECISIONS): every one, allow
# included; and the guardrails that failed (raised: error; timed out: timeout), by guardrail and kind.
METRIC_GUARDRAIL_DECISIONS: Final = "toolspan_guardrail_decisions_total"
METRIC_GUARDRAIL_FAILURES: Final = "toolspan_guardrail_failures_total"
# The routes of the tool loop, whose held turns can be lost (the Azure-style paths count apart).
TOOL_LOOP_ROUTES: Final = ("/v1/chat/completions", "/v1/responses", "/v1/messages")

# Gauges named so say whether something is up (1) or down (0); merged over the workers of
# `toolspan serve --workers N` as the minimum (down when any worker sees it down), every other
# gauge as the sum.
UP_GAUGE_SUFFIX: Final = "_up"

# --- labels and their bounded values ------------------------------------------------------------
LABEL_TOOL: Final = "tool"
LABEL_OUTCOME: Final = "outcome"
LABEL_SIDE: Final = "side"  # of the tool metrics: gateway or client (SIDES)
LABEL_REASON: Final = "reason"
LABEL_PARAMETER: Final = "parameter"  # a gateway tool's declared parameter
LABEL_MODE: Final = "mode"  # of the repairs: REPAIR_OBSERVE or REPAIR_APPLY
LABEL_MODEL: Final = "model"
LABEL_STATUS: Final = "status"
LABEL_TYPE: Final = "type"
LABEL_ROUTE: Final = "route"
LABEL_KIND: Final = "kind"
LABEL_SERVER: Final = "server"  # a configured MCP server's name
LABEL_DECISION: Final = "decision"  # of the approval metrics: DECISIONS; of the guardrails': GUARDRAIL_DECISIONS
LABEL_GUARDRAIL: Final = "guardrail"  # a configured guardrail's name (a built-in's, an import path, its own name)
LABEL_UPSTREAM: Final = "upstream"  # a configured upstream's name
LABEL_FROM: Final = "from"  # of the fallbacks: the upstream a call moved on from
LABEL_TO: Final = "to"
LABEL_PAIR: Final = "pair"  # of the translated calls: the client's API and the provider's (messages->chat)
EXEMPLAR_TRACE_ID: Final = "trace_id"

UNKNOWN_TOOL: Final = "__unknown__"  # every name outside the registry counts as this one
OTHER_MODEL: Final = "__other__"  # model names past the configured number of distinct ones, or too long
TOKEN_INPUT: Final = "input"
TOKEN_OUTPUT: Final = "output"
# The label values of outcomes, rejection reasons and retry kinds are the types' own values, so the
# lists cannot drift apart; "cancelled" is a call that never finished (the client left).
OUTCOMES: Final = (*get_args(Status), OUTCOME_REPAIRED, "cancelled")
RETRY_KINDS: Final = get_args(RetryKind)
DECISIONS: Final = get_args(Decided)
SIDES: Final = get_args(Side)
SIDE_GATEWAY: Final = "gateway"
SIDE_CLIENT: Final = "client"
# A client tool's name past the configured number of distinct ones (or too long), as a metric label.
OTHER_CLIENT_TOOL: Final = "__other__"
REJECTION_REASONS: Final = get_args(RejectionReason)
# gateway.guardrails.verdicts' Decision and Moment (tests/telemetry/test_guardrails.py holds them equal;
# gateway.guardrails imports the tools, which import this module).
GUARDRAIL_DECISIONS: Final = ("allow", "deny", "rewrite", "ask", "block", "mask", "flag")
GUARDRAIL_MOMENTS: Final = ("before", "after")
# Which decision of a call's guardrails stands: the strongest.
GUARDRAIL_STRENGTH: Final = {"allow": 0, "flag": 1, "rewrite": 2, "mask": 2, "ask": 3, "deny": 4, "block": 4}
GUARDRAIL_FAILURE_TIMEOUT: Final = "timeout"  # the `kind` of a guardrail that timed out; one that raised:
GUARDRAIL_FAILURE_ERROR: Final = "error"
# Why the trajectory store lost spans: a write failed (disk full or broken, file read-only or
# gone), or the writer fell too far behind.
STORE_DROP_WRITE: Final = "write_failed"
STORE_DROP_BACKLOG: Final = "backlog"
# The kinds of entry in the shared state store whose values may be found unreadable (garbage).
STATE_KINDS: Final = get_args(StateKind)
