"""The Prometheus metrics, registered on a CollectorRegistry the caller owns. Those the event loop
moves on every request and tool call are `telemetry.series`' LoopMetrics; the others
prometheus_client's own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics import MetricWrapperBase

from telemetry import names
from telemetry.series import CounterSeries, GaugeSeries, HistogramSeries, LoopMetric, counter, histogram

TOOL_DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
REQUEST_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
ROUND_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 15, 20)
# A client's tool runs on its side, for as long as a command or a person takes: up to an hour.
APPROVAL_WAIT_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
CLIENT_ROUNDTRIP_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)


def encoder_for(accept: str | None) -> tuple[Callable[[CollectorRegistry], bytes], str]:
    """The encoder and content type of the format a scraper's Accept header asks for: OpenMetrics
    (with exemplars) when it asks for it, else the classic text format (also for a version
    prometheus_client cannot parse)."""
    try:
        return choose_encoder(accept or "")
    except (TypeError, ValueError):
        return choose_encoder("")


@dataclass(frozen=True, slots=True)
class RequestSeries:
    """The series one answered request moves, for one route and status."""

    count: CounterSeries  # requests_total{route,status}
    duration: HistogramSeries  # request_duration_seconds{route}

    def answered(self, seconds: float, trace_id: int | None, now: float) -> None:
        """A request answered after `seconds` (see HistogramSeries.observe for the rest)."""
        self.count.value += 1
        self.duration.observe(seconds, trace_id, now)


@dataclass(frozen=True, slots=True)
class UpstreamSeries:
    """The series one provider call moves, for one model label and status."""

    calls: CounterSeries  # upstream_requests_total{upstream,model,status}
    duration: HistogramSeries  # upstream_request_duration_seconds{upstream,model}
    input_tokens: CounterSeries  # tokens_total{model,type=input}
    output_tokens: CounterSeries  # tokens_total{model,type=output}

    def answered(self, seconds: float, trace_id: int | None, now: float, input_tokens: int | None,
                 output_tokens: int | None) -> None:
        """A provider call that took `seconds`, and the tokens it reported (None: not reported)."""
        self.calls.value += 1
        self.duration.observe(seconds, trace_id, now)
        if input_tokens is not None:
            self.input_tokens.inc(input_tokens)
        if output_tokens is not None:
            self.output_tokens.inc(output_tokens)


class Metrics:
    """One instance per app; never module-level, so tests and apps do not share counts."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        # What every request and tool call moves: metrics of the event loop's thread (LoopMetric).
        self.tool_calls = counter(
            names.METRIC_TOOL_CALLS, "Tool calls handled, by tool, outcome and side (gateway: run by the gateway; "
            "client: a call of the client's own tool, checked and handed to the client).",
            (names.LABEL_TOOL, names.LABEL_OUTCOME, names.LABEL_SIDE), registry)
        self.tool_call_duration = histogram(
            names.METRIC_TOOL_CALL_DURATION, "Time from lookup to outcome of one tool call.",
            (names.LABEL_TOOL, names.LABEL_OUTCOME), TOOL_DURATION_BUCKETS, registry)
        self.tool_rejections = counter(
            names.METRIC_TOOL_REJECTIONS, "Tool calls refused before the body ran (or, of a client tool, "
            "found not to fit its declaration), by reason and side.",
            (names.LABEL_TOOL, names.LABEL_REASON, names.LABEL_SIDE), registry)
        self.tool_unchecked = counter(
            names.METRIC_TOOL_UNCHECKED, "Tool calls whose arguments were not checked against the tool's schema "
            "(a client tool's calls of outcome unchecked; a gateway tool's whose values were not), by tool, reason "
            "and side.", (names.LABEL_TOOL, names.LABEL_REASON, names.LABEL_SIDE), registry)
        self.tool_aliases_used = counter(
            names.METRIC_TOOL_ALIASES_USED, "Parameter aliases the gateway's tools accepted in calls, by tool and "
            "parameter.", (names.LABEL_TOOL, names.LABEL_PARAMETER), registry)
        self.tool_repairs = counter(
            names.METRIC_TOOL_REPAIRS, "Calls of the gateway's tools whose arguments had a sure fix, by tool and mode "
            "(observe: recorded, the call rejected; apply: run repaired).", (names.LABEL_TOOL, names.LABEL_MODE),
            registry)
        self.tool_retries = counter(
            names.METRIC_TOOL_RETRIES, "Calls that retry a failed call of the same tool in the trajectory, by kind "
            "(verbatim: same arguments; corrected: changed arguments) and side.",
            (names.LABEL_TOOL, names.LABEL_KIND, names.LABEL_SIDE), registry)
        self.tool_recoveries = counter(
            names.METRIC_TOOL_RECOVERIES, "Retries that succeeded (of a client tool: passed the check), by tool, "
            "retry kind and side.",
            (names.LABEL_TOOL, names.LABEL_KIND, names.LABEL_SIDE), registry)
        self.client_tool_roundtrip = histogram(
            names.METRIC_CLIENT_TOOL_ROUNDTRIP, "Time from the answer that handed a call of the client's own tool "
            "over to the request that brought its result: the client's tool time plus its own overhead.",
            (names.LABEL_TOOL, names.LABEL_OUTCOME), CLIENT_ROUNDTRIP_BUCKETS, registry)
        self.approval_decisions = counter(
            names.METRIC_APPROVAL_DECISIONS, "Tool calls a reviewer was asked to approve, by tool and what became of "
            "it (approve, deny, timeout, cancelled: the client left, shutdown).",
            (names.LABEL_TOOL, names.LABEL_DECISION), registry)
        self.approval_wait = histogram(
            names.METRIC_APPROVAL_WAIT, "Time a tool call waited for its reviewer's decision.",
            (names.LABEL_TOOL, names.LABEL_DECISION), APPROVAL_WAIT_BUCKETS, registry)
        self.guardrail_decisions = counter(
            names.METRIC_GUARDRAIL_DECISIONS, "Guardrails' decisions on tool calls, allow included, by guardrail, "
            "tool and decision (allow, deny, rewrite, ask before a call runs; allow, block, mask on its result; "
            "flag at either).", (names.LABEL_GUARDRAIL, names.LABEL_TOOL, names.LABEL_DECISION), registry)
        self.guardrail_failures = counter(
            names.METRIC_GUARDRAIL_FAILURES, "Guardrails that failed on a tool call, by guardrail and kind (timeout; "
            "error: it raised, or answered no verdict); guardrail_failure decided in their place.",
            (names.LABEL_GUARDRAIL, names.LABEL_KIND), registry)
        self.upstream_requests = counter(
            names.METRIC_UPSTREAM_REQUESTS, "Calls to the provider, by upstream, model and HTTP status (or error).",
            (names.LABEL_UPSTREAM, names.LABEL_MODEL, names.LABEL_STATUS), registry)
        self.upstream_duration = histogram(
            names.METRIC_UPSTREAM_DURATION, "Time of one provider call, a whole stream included, by upstream and "
            "model.", (names.LABEL_UPSTREAM, names.LABEL_MODEL), REQUEST_DURATION_BUCKETS, registry)
        self.upstream_fallbacks = counter(
            names.METRIC_UPSTREAM_FALLBACKS, "Provider calls that moved on to another upstream after one failed "
            "before answering, by the upstream left, the one tried next, and why (a status, timeout, connection).",
            (names.LABEL_FROM, names.LABEL_TO, names.LABEL_REASON), registry)
        self.translated_calls = counter(
            names.METRIC_TRANSLATED_CALLS, "Provider calls made in another API than their client's (the request "
            "and its answer translated), by pair: the client's API and the provider's.", (names.LABEL_PAIR,), registry)
        self.upstream_retries = counter(
            names.METRIC_UPSTREAM_RETRIES, "Provider calls the gateway made again itself, after a retryable failure "
            "in a request for which its tools had already run, by model.", (names.LABEL_MODEL,), registry)
        self.tokens = counter(
            names.METRIC_TOKENS, "Tokens the provider reported, by model and type (input/output).",
            (names.LABEL_MODEL, names.LABEL_TYPE), registry)
        self.requests = counter(
            names.METRIC_REQUESTS, "Requests answered, by route and HTTP status.",
            (names.LABEL_ROUTE, names.LABEL_STATUS), registry)
        self.request_duration = histogram(
            names.METRIC_REQUEST_DURATION, "Time to answer one request, tool rounds included.",
            (names.LABEL_ROUTE,), REQUEST_DURATION_BUCKETS, registry)
        self.in_flight = LoopMetric("gauge", names.METRIC_REQUESTS_IN_FLIGHT, "Requests being handled now.", (),
                                    GaugeSeries, registry).series
        self.tool_rounds = histogram(names.METRIC_TOOL_ROUNDS, "Model turns (provider calls) per chat request.", (),
                                      ROUND_BUCKETS, registry).series
        # Moved now and then, from any thread (the trajectory store's writer counts its losses).
        self.approvals_pending = Gauge(
            names.METRIC_APPROVALS_PENDING, "Tool calls waiting for a reviewer's decision in this process.",
            registry=registry)
        self.upstream_up = Gauge(
            names.METRIC_UPSTREAM_UP, "1 while the upstream is in its routes, 0 while it cools down after failures "
            "(as this process last saw it).", (names.LABEL_UPSTREAM,), registry=registry)
        self.mcp_server_up = Gauge(
            names.METRIC_MCP_SERVER_UP, "1 while the MCP server is connected and its tools are callable, else 0.",
            (names.LABEL_SERVER,), registry=registry)
        self.mcp_server_disconnects = Counter(
            names.METRIC_MCP_SERVER_DISCONNECTS, "Connections to an MCP server that were lost (it is reconnected "
            "with backoff).", (names.LABEL_SERVER,), registry=registry)
        self.trajectory_store_dropped = Counter(
            names.METRIC_TRAJECTORY_STORE_DROPPED, "Spans the trajectory store could not keep, by reason "
            "(write_failed: disk full or broken, file read-only or gone; backlog: the writer fell behind).",
            (names.LABEL_REASON,), registry=registry)
        # Registered by state_store_shared: without Redis there is no such gauge (a dashboard reads
        # its absence as "not configured", where a 1 would say Redis is reachable).
        self.state_store_up = Gauge(
            names.METRIC_STATE_STORE_UP, "1 while the shared state store (Redis) answers, 0 after a command to it "
            "failed or timed out; absent without one (the memory store).", registry=None)
        self.state_store_failures = Counter(
            names.METRIC_STATE_STORE_FAILURES, "Commands to the shared state store (Redis) that failed or timed out.",
            registry=registry)
        self.state_store_losses = Counter(
            names.METRIC_STATE_STORE_LOSSES, "Times a gateway found that the shared state store (Redis) had lost "
            "its data (restarted without persistence, flushed): turns held and retry state from before are gone.",
            registry=registry)
        self.state_store_unreadable = Counter(
            names.METRIC_STATE_STORE_UNREADABLE, "Values read from the shared state store (Redis) that were not what "
            "the gateway wrote there (not JSON, not UTF-8, another shape or Redis type), by the kind of entry; each "
            "was treated as missing (the store's own bookkeeping: replaced).", (names.LABEL_KIND,), registry=registry)
        self.limit_refusals = Counter(
            names.METRIC_LIMIT_REFUSALS, "Requests (or the rest of a tool loop) a gateway key's limit refused, by "
            "key and limit.", (names.LABEL_KEY, names.LABEL_LIMIT), registry=registry)
        self.limit_usage = Gauge(
            names.METRIC_LIMIT_USAGE, "What a gateway key had used of a limit in its window when this process last "
            "checked it (money in millionths of the prices' currency).", (names.LABEL_KEY, names.LABEL_LIMIT),
            registry=registry)
        self.limit_bound = Gauge(
            names.METRIC_LIMIT_BOUND, "A gateway key's limit, in the unit of toolspan_limit_usage.",
            (names.LABEL_KEY, names.LABEL_LIMIT), registry=registry)
        self.limits_unavailable = Counter(
            names.METRIC_LIMITS_UNAVAILABLE, "Limit checks that could not be made (the shared state unreachable) "
            "and were let through (limits_when_state_down = open).", registry=registry)
        self.held_turns_lost = Counter(
            names.METRIC_HELD_TURNS_LOST, "Requests that continued a turn (or a gateway response id) the gateway no "
            "longer held (expired, pushed out, lost in a restart); each went on with the client's copy of the "
            "conversation, without the gateway's rounds in it.", (names.LABEL_ROUTE,), registry=registry)
        for route in names.TOOL_LOOP_ROUTES:  # at 0 from the start, as the next ones
            self.held_turns_lost.labels(route)
        for kind in names.STATE_KINDS:  # at 0 from the start: an alert on its increase sees the first one
            self.state_store_unreadable.labels(kind)
        for reason in (names.STORE_DROP_WRITE, names.STORE_DROP_BACKLOG):  # at 0 from the start: an alert
            self.trajectory_store_dropped.labels(reason)  # on its increase sees the first loss
        # Label children of the prometheus_client metrics, looked up per call: every label here is
        # bounded (see names.py), so this cache is too, and it saves prometheus_client's lock and
        # validation each time.
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._request_series: dict[tuple[str, int], RequestSeries] = {}
        self._upstream_series: dict[tuple[str, str, str], UpstreamSeries] = {}

    def state_store_shared(self) -> None:
        """The state is kept in a shared store (Redis): its gauge is exported from now on, at 1
        until a command to it fails."""
        self.state_store_up.set(1)
        self.registry.register(self.state_store_up)

    def state_store_answered(self, up: bool) -> None:
        """A command to the shared state store succeeded (`up`), or failed or timed out."""
        self.state_store_up.set(1 if up else 0)
        if not up:
            self.state_store_failures.inc()

    def state_store_lost(self) -> None:
        """The shared state store was found to have lost its data."""
        self.state_store_losses.inc()

    def state_store_unreadable_value(self, kind: str) -> None:
        """A value of this kind read from the shared state store was garbage."""
        self.child(self.state_store_unreadable, kind).inc()

    def child(self, metric: MetricWrapperBase, *values: str) -> Any:
        """`metric.labels(*values)` of one of the prometheus_client metrics, cached."""
        key = (id(metric), values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return found

    def request_series(self, route: str, status: int) -> RequestSeries:
        """The series of an answered request, cached: one lookup per request, not one per series
        (for a request and its provider call, two lookups where six were)."""
        found = self._request_series.get((route, status))
        if found is None:
            found = self._request_series[route, status] = RequestSeries(
                self.requests.labels(route, str(status)), self.request_duration.labels(route))
        return found

    def upstream_series(self, upstream: str, model: str, status: str) -> UpstreamSeries:
        """The series of a provider call, cached like request_series."""
        found = self._upstream_series.get((upstream, model, status))
        if found is None:
            found = self._upstream_series[upstream, model, status] = UpstreamSeries(
                self.upstream_requests.labels(upstream, model, status), self.upstream_duration.labels(upstream, model),
                self.tokens.labels(model, names.TOKEN_INPUT), self.tokens.labels(model, names.TOKEN_OUTPUT))
        return found
