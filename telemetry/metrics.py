"""The Prometheus metrics, registered on a CollectorRegistry the caller owns."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics import MetricWrapperBase

from telemetry import names

TOOL_DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
REQUEST_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
ROUND_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 15, 20)
EXEMPLAR_INTERVAL = 1.0  # seconds: at most one exemplar per bucket of a series in this time


def encoder_for(accept: str | None) -> tuple[Callable[[CollectorRegistry], bytes], str]:
    """The encoder and content type of the format a scraper's Accept header asks for: OpenMetrics
    (with exemplars) when it asks for it, else the classic text format (also for a version
    prometheus_client cannot parse)."""
    try:
        return choose_encoder(accept or "")
    except (TypeError, ValueError):
        return choose_encoder("")


class ExemplarHistogram:
    """One series (label child) of a duration histogram, linking its buckets to traces: an
    observation with a trace id takes it as its bucket's exemplar when that bucket has taken none
    for EXEMPLAR_INTERVAL, and is observed plainly otherwise.

    Exemplars are samples: prometheus_client keeps only the latest of each bucket, and a scrape
    (every 15 s or so) sees only that one, so at most one a second per bucket and series loses
    nothing a dashboard shows (Grafana draws the exemplars Prometheus scraped; a scrape more
    often than once a second may show a bucket's exemplar again), while each observation of a
    busy series no longer pays for one: 1.8 us (validated, time-stamped, taken under a lock)
    against 0.7 us plain, the trace id formatted only when taken. `bench/request_telemetry.py
    --repeats 9` (a request: two histograms), with only this change undone against the code with
    it: ours 62.4 -> 57.8 us, ours / sdk 1.27 -> 1.19."""

    __slots__ = ("_bounds", "_child", "_due")

    def __init__(self, child: Any, buckets: Sequence[float]) -> None:
        self._child = child
        self._bounds = (*buckets, float("inf"))  # the histogram's upper bounds, as it finds a bucket
        self._due = [float("-inf")] * len(self._bounds)  # per bucket: when it may take an exemplar again

    def observe(self, value: float, trace_id: int | None, now: float) -> None:
        """`value` observed; `trace_id` is the trace behind it, None for a trace nobody keeps.
        `now`: a monotonic clock in seconds (perf_counter, which the caller measured `value` with)."""
        if trace_id is not None:
            bucket = bisect_left(self._bounds, value)  # the first bound >= value, as prometheus_client's
            if now >= self._due[bucket]:
                self._due[bucket] = now + EXEMPLAR_INTERVAL
                self._child.observe(value, {names.EXEMPLAR_TRACE_ID: format(trace_id, "032x")})
                return
        self._child.observe(value)


@dataclass(frozen=True, slots=True)
class RequestSeries:
    """The series one answered request moves, for one route and status."""

    answered: Any  # requests_total{route,status}
    duration: ExemplarHistogram  # request_duration_seconds{route}


@dataclass(frozen=True, slots=True)
class UpstreamSeries:
    """The series one provider call moves, for one model label and status."""

    calls: Any  # upstream_requests_total{model,status}
    duration: ExemplarHistogram  # upstream_request_duration_seconds{model}
    input_tokens: Any  # tokens_total{model,type=input}
    output_tokens: Any  # tokens_total{model,type=output}


class Metrics:
    """One instance per app; never module-level, so tests and apps do not share counts."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._bounds: dict[int, Sequence[float]] = {}  # each duration histogram's buckets, for its exemplars
        self.tool_calls = Counter(
            names.METRIC_TOOL_CALLS, "Tool calls handled, by tool and outcome.",
            (names.LABEL_TOOL, names.LABEL_OUTCOME), registry=registry)
        self.tool_call_duration = self._duration(
            names.METRIC_TOOL_CALL_DURATION, "Time from lookup to outcome of one tool call.",
            (names.LABEL_TOOL, names.LABEL_OUTCOME), TOOL_DURATION_BUCKETS)
        self.tool_rejections = Counter(
            names.METRIC_TOOL_REJECTIONS, "Tool calls refused before the body ran, by reason.",
            (names.LABEL_TOOL, names.LABEL_REASON), registry=registry)
        self.tool_retries = Counter(
            names.METRIC_TOOL_RETRIES, "Calls that retry a failed call of the same tool in the trajectory, by kind "
            "(verbatim: same arguments; corrected: changed arguments).",
            (names.LABEL_TOOL, names.LABEL_KIND), registry=registry)
        self.tool_recoveries = Counter(
            names.METRIC_TOOL_RECOVERIES, "Retries that succeeded, by tool and retry kind.",
            (names.LABEL_TOOL, names.LABEL_KIND), registry=registry)
        self.upstream_requests = Counter(
            names.METRIC_UPSTREAM_REQUESTS, "Calls to the provider, by model and HTTP status (or error).",
            (names.LABEL_MODEL, names.LABEL_STATUS), registry=registry)
        self.upstream_duration = self._duration(
            names.METRIC_UPSTREAM_DURATION, "Time of one provider call, a whole stream included.",
            (names.LABEL_MODEL,), REQUEST_DURATION_BUCKETS)
        self.tokens = Counter(
            names.METRIC_TOKENS, "Tokens the provider reported, by model and type (input/output).",
            (names.LABEL_MODEL, names.LABEL_TYPE), registry=registry)
        self.requests = Counter(
            names.METRIC_REQUESTS, "Requests answered, by route and HTTP status.",
            (names.LABEL_ROUTE, names.LABEL_STATUS), registry=registry)
        self.request_duration = self._duration(
            names.METRIC_REQUEST_DURATION, "Time to answer one request, tool rounds included.",
            (names.LABEL_ROUTE,), REQUEST_DURATION_BUCKETS)
        self.in_flight = Gauge(names.METRIC_REQUESTS_IN_FLIGHT, "Requests being handled now.", registry=registry)
        self.tool_rounds = Histogram(
            names.METRIC_TOOL_ROUNDS, "Model turns (provider calls) per chat request.",
            buckets=ROUND_BUCKETS, registry=registry)
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
        self.state_store_up = Gauge(
            names.METRIC_STATE_STORE_UP, "1 while the shared state store (Redis) answers, 0 after a command to it "
            "failed or timed out (the memory store is always up).", registry=registry)
        self.state_store_up.set(1)
        self.state_store_failures = Counter(
            names.METRIC_STATE_STORE_FAILURES, "Commands to the shared state store (Redis) that failed or timed out.",
            registry=registry)
        self.state_store_losses = Counter(
            names.METRIC_STATE_STORE_LOSSES, "Times a gateway found that the shared state store (Redis) had lost "
            "its data (restarted without persistence, flushed): turns held and retry state from before are gone.",
            registry=registry)
        for reason in (names.STORE_DROP_WRITE, names.STORE_DROP_BACKLOG):  # at 0 from the start: an alert
            self.trajectory_store_dropped.labels(reason)  # on its increase sees the first loss
        # Label children, looked up per call: every label here is bounded (see names.py), so
        # this cache is too, and it saves prometheus_client's lock and validation each time.
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._histograms: dict[tuple[int, tuple[str, ...]], ExemplarHistogram] = {}
        self._request_series: dict[tuple[str, str], RequestSeries] = {}
        self._upstream_series: dict[tuple[str, str], UpstreamSeries] = {}

    def state_store_answered(self, up: bool) -> None:
        """A command to the shared state store succeeded (`up`), or failed or timed out."""
        self.state_store_up.set(1 if up else 0)
        if not up:
            self.state_store_failures.inc()

    def state_store_lost(self) -> None:
        """The shared state store was found to have lost its data."""
        self.state_store_losses.inc()

    def child(self, metric: MetricWrapperBase, *values: str) -> Any:
        """`metric.labels(*values)`, cached."""
        key = (id(metric), values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return found

    def _duration(self, name: str, documentation: str, labels: tuple[str, ...],
                  buckets: Sequence[float]) -> Histogram:
        """A duration histogram whose series take exemplars (`exemplar_histogram`)."""
        histogram = Histogram(name, documentation, labels, buckets=buckets, registry=self.registry)
        self._bounds[id(histogram)] = buckets
        return histogram

    def exemplar_histogram(self, histogram: Histogram, *values: str) -> ExemplarHistogram:
        """`histogram.labels(*values)` as an ExemplarHistogram, cached: one per series, so that its
        exemplars are limited per series. `histogram`: one of this instance's duration histograms."""
        key = (id(histogram), values)
        found = self._histograms.get(key)
        if found is None:
            found = self._histograms[key] = ExemplarHistogram(histogram.labels(*values), self._bounds[id(histogram)])
        return found

    def request_series(self, route: str, status: str) -> RequestSeries:
        """The series of an answered request, cached: one lookup per request, not one per series
        (for a request and its provider call, two lookups of 0.16 us where six of 0.17 were)."""
        found = self._request_series.get((route, status))
        if found is None:
            found = self._request_series[route, status] = RequestSeries(
                self.child(self.requests, route, status),
                self.exemplar_histogram(self.request_duration, route))
        return found

    def upstream_series(self, model: str, status: str) -> UpstreamSeries:
        """The series of a provider call, cached like request_series."""
        found = self._upstream_series.get((model, status))
        if found is None:
            found = self._upstream_series[model, status] = UpstreamSeries(
                self.child(self.upstream_requests, model, status),
                self.exemplar_histogram(self.upstream_duration, model),
                self.child(self.tokens, model, names.TOKEN_INPUT), self.child(self.tokens, model, names.TOKEN_OUTPUT))
        return found
