"""The metrics the event loop moves (telemetry.series.LoopMetric): the page shows what
prometheus_client's own metrics would show for the same updates, in both formats; the request
duration's exemplars are sampled at most once per bucket per second of each series."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest as classic_page
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_page

from telemetry import names
from telemetry.metrics import (
    APPROVAL_WAIT_BUCKETS,
    CLIENT_ROUNDTRIP_BUCKETS,
    REQUEST_DURATION_BUCKETS,
    ROUND_BUCKETS,
    TOOL_DURATION_BUCKETS,
    Metrics,
)
from telemetry.series import EXEMPLAR_INTERVAL

CHAT = "/v1/chat/completions"


def _without_times(page: bytes) -> str:
    """A page with its series' creation times and its exemplars' times left out."""
    text = re.sub(r"_created(\{[^}]*\})? \S+", r"_created\1 T", page.decode())
    return re.sub(r"(# \{[^}]*\} \S+) \S+", r"\1 T", text)


def _ours() -> CollectorRegistry:
    metrics = Metrics(CollectorRegistry())
    metrics.in_flight.inc()
    series = metrics.upstream_series("default", "m", "200")
    series.input_tokens.inc(31)
    series.output_tokens.inc(1)
    series.calls.inc()
    series.duration.observe(0.001, 0xABC, now=100.0)
    metrics.upstream_fallbacks.labels("east", "west", "429").inc()
    metrics.translated_calls.labels("messages->chat").inc()
    metrics.upstream_up.labels("west").set(1)
    metrics.in_flight.dec()
    metrics.tool_rounds.observe(2)
    metrics.request_series(CHAT, 200).answered(0.3, None, 0.0)
    metrics.request_series(CHAT, 200).duration.observe(120.0)  # on a bound
    metrics.tool_calls.labels("echo", "ok", "gateway").inc()
    metrics.tool_calls.labels("shell", "rejected", "client").inc()
    metrics.tool_call_duration.labels("echo", "ok").observe(0.01, 0x5, now=1.0)
    metrics.tool_rejections.labels("echo", "parser", "gateway").inc()
    metrics.tool_retries.labels("echo", "verbatim", "gateway").inc()
    metrics.tool_recoveries.labels("echo", "verbatim", "gateway").inc()
    metrics.tool_aliases_used.labels("read_file", "path").inc()
    metrics.tool_repairs.labels("add", "apply").inc()
    metrics.client_tool_roundtrip.labels("shell", "returned").observe(4.2)
    metrics.approval_decisions.labels("pay", "approve").inc()
    metrics.approval_wait.labels("pay", "approve").observe(2.5)
    metrics.guardrail_decisions.labels("secrets", "fetch", "mask").inc()
    metrics.guardrail_failures.labels("slow_check", "timeout").inc()
    metrics.mcp_server_up.labels("files").set(1)
    metrics.state_store_shared()  # as on Redis
    return metrics.registry


def _theirs() -> CollectorRegistry:
    """The same updates on prometheus_client's own metrics, declared as telemetry.metrics declares them."""
    registry = CollectorRegistry()
    ours = {family.name: family.documentation for family in _ours().collect()}

    def doc(name: str) -> str:
        return ours[name.removesuffix("_total")]

    tool = (names.LABEL_TOOL, names.LABEL_OUTCOME)
    calls = Counter(names.METRIC_TOOL_CALLS, doc(names.METRIC_TOOL_CALLS), (*tool, names.LABEL_SIDE),
                    registry=registry)
    call_duration = Histogram(names.METRIC_TOOL_CALL_DURATION, doc(names.METRIC_TOOL_CALL_DURATION), tool,
                              buckets=TOOL_DURATION_BUCKETS, registry=registry)
    rejections = Counter(names.METRIC_TOOL_REJECTIONS, doc(names.METRIC_TOOL_REJECTIONS),
                         (names.LABEL_TOOL, names.LABEL_REASON, names.LABEL_SIDE), registry=registry)
    Counter(names.METRIC_TOOL_UNCHECKED, doc(names.METRIC_TOOL_UNCHECKED),
            (names.LABEL_TOOL, names.LABEL_REASON, names.LABEL_SIDE), registry=registry)
    aliases = Counter(names.METRIC_TOOL_ALIASES_USED, doc(names.METRIC_TOOL_ALIASES_USED),
                      (names.LABEL_TOOL, names.LABEL_PARAMETER), registry=registry)
    repairs = Counter(names.METRIC_TOOL_REPAIRS, doc(names.METRIC_TOOL_REPAIRS), (names.LABEL_TOOL, names.LABEL_MODE),
                      registry=registry)
    retried = (names.LABEL_TOOL, names.LABEL_KIND, names.LABEL_SIDE)
    retries = Counter(names.METRIC_TOOL_RETRIES, doc(names.METRIC_TOOL_RETRIES), retried, registry=registry)
    recoveries = Counter(names.METRIC_TOOL_RECOVERIES, doc(names.METRIC_TOOL_RECOVERIES), retried,
                         registry=registry)
    roundtrip = Histogram(names.METRIC_CLIENT_TOOL_ROUNDTRIP, doc(names.METRIC_CLIENT_TOOL_ROUNDTRIP), tool,
                          buckets=CLIENT_ROUNDTRIP_BUCKETS, registry=registry)
    decided = (names.LABEL_TOOL, names.LABEL_DECISION)
    decisions = Counter(names.METRIC_APPROVAL_DECISIONS, doc(names.METRIC_APPROVAL_DECISIONS), decided,
                        registry=registry)
    approval_wait = Histogram(names.METRIC_APPROVAL_WAIT, doc(names.METRIC_APPROVAL_WAIT), decided,
                              buckets=APPROVAL_WAIT_BUCKETS, registry=registry)
    guardrail_decisions = Counter(names.METRIC_GUARDRAIL_DECISIONS, doc(names.METRIC_GUARDRAIL_DECISIONS),
                                  (names.LABEL_GUARDRAIL, names.LABEL_TOOL, names.LABEL_DECISION), registry=registry)
    guardrail_failures = Counter(names.METRIC_GUARDRAIL_FAILURES, doc(names.METRIC_GUARDRAIL_FAILURES),
                                 (names.LABEL_GUARDRAIL, names.LABEL_KIND), registry=registry)
    upstream = Counter(names.METRIC_UPSTREAM_REQUESTS, doc(names.METRIC_UPSTREAM_REQUESTS),
                       (names.LABEL_UPSTREAM, names.LABEL_MODEL, names.LABEL_STATUS), registry=registry)
    upstream_duration = Histogram(names.METRIC_UPSTREAM_DURATION, doc(names.METRIC_UPSTREAM_DURATION),
                                  (names.LABEL_UPSTREAM, names.LABEL_MODEL), buckets=REQUEST_DURATION_BUCKETS,
                                  registry=registry)
    fallbacks = Counter(names.METRIC_UPSTREAM_FALLBACKS, doc(names.METRIC_UPSTREAM_FALLBACKS),
                        (names.LABEL_FROM, names.LABEL_TO, names.LABEL_REASON), registry=registry)
    translated = Counter(names.METRIC_TRANSLATED_CALLS, doc(names.METRIC_TRANSLATED_CALLS), (names.LABEL_PAIR,),
                         registry=registry)
    Counter(names.METRIC_UPSTREAM_RETRIES, doc(names.METRIC_UPSTREAM_RETRIES), (names.LABEL_MODEL,), registry=registry)
    tokens = Counter(names.METRIC_TOKENS, doc(names.METRIC_TOKENS), (names.LABEL_MODEL, names.LABEL_TYPE),
                     registry=registry)
    requests = Counter(names.METRIC_REQUESTS, doc(names.METRIC_REQUESTS), (names.LABEL_ROUTE, names.LABEL_STATUS),
                       registry=registry)
    request_duration = Histogram(names.METRIC_REQUEST_DURATION, doc(names.METRIC_REQUEST_DURATION),
                                 (names.LABEL_ROUTE,), buckets=REQUEST_DURATION_BUCKETS, registry=registry)
    in_flight = Gauge(names.METRIC_REQUESTS_IN_FLIGHT, doc(names.METRIC_REQUESTS_IN_FLIGHT), registry=registry)
    rounds = Histogram(names.METRIC_TOOL_ROUNDS, doc(names.METRIC_TOOL_ROUNDS), buckets=ROUND_BUCKETS,
                       registry=registry)
    rest = Metrics(CollectorRegistry())  # the metrics that are prometheus_client's own already
    for metric in (rest.approvals_pending, rest.upstream_up, rest.mcp_server_up, rest.mcp_server_disconnects,
                   rest.trajectory_store_dropped,
                   rest.state_store_failures, rest.state_store_losses,
                   rest.state_store_unreadable, rest.limit_refusals, rest.limit_usage, rest.limit_bound,
                   rest.limits_unavailable, rest.held_turns_lost):
        registry.register(metric)
    registry.register(rest.state_store_up)  # last, as Metrics registers it once it hears of Redis
    rest.mcp_server_up.labels("files").set(1)
    rest.state_store_up.set(1)
    in_flight.inc()
    tokens.labels("m", names.TOKEN_INPUT).inc(31)
    tokens.labels("m", names.TOKEN_OUTPUT).inc(1)
    upstream.labels("default", "m", "200").inc()
    fallbacks.labels("east", "west", "429").inc()
    translated.labels("messages->chat").inc()
    rest.upstream_up.labels("west").set(1)
    upstream_duration.labels("default", "m").observe(0.001, {names.EXEMPLAR_TRACE_ID: f"{0xABC:032x}"})
    in_flight.dec()
    rounds.observe(2)
    requests.labels(CHAT, "200").inc()
    request_duration.labels(CHAT).observe(0.3)
    request_duration.labels(CHAT).observe(120.0)
    calls.labels("echo", "ok", "gateway").inc()
    calls.labels("shell", "rejected", "client").inc()
    call_duration.labels("echo", "ok").observe(0.01, {names.EXEMPLAR_TRACE_ID: f"{0x5:032x}"})
    rejections.labels("echo", "parser", "gateway").inc()
    retries.labels("echo", "verbatim", "gateway").inc()
    recoveries.labels("echo", "verbatim", "gateway").inc()
    aliases.labels("read_file", "path").inc()
    repairs.labels("add", "apply").inc()
    roundtrip.labels("shell", "returned").observe(4.2)
    decisions.labels("pay", "approve").inc()
    approval_wait.labels("pay", "approve").observe(2.5)
    guardrail_decisions.labels("secrets", "fetch", "mask").inc()
    guardrail_failures.labels("slow_check", "timeout").inc()
    return registry


@pytest.mark.parametrize("page", [openmetrics_page, classic_page], ids=["openmetrics", "classic"])
def test_the_page_is_what_prometheus_client_metrics_would_show(page: object) -> None:
    assert callable(page)
    assert _without_times(page(_ours())) == _without_times(page(_theirs()))


def test_a_counter_only_goes_up() -> None:
    metrics = Metrics(CollectorRegistry())
    with pytest.raises(ValueError, match="only goes up"):
        metrics.requests.labels(CHAT, "200").inc(-1)


def test_labels_are_checked_in_number() -> None:
    metrics = Metrics(CollectorRegistry())
    with pytest.raises(ValueError, match="takes the labels route, status"):
        metrics.requests.labels(CHAT)


def test_a_name_taken_twice_on_a_registry_fails() -> None:
    registry = CollectorRegistry()
    Metrics(registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Metrics(registry)


# --- exemplars: at most one a bucket a second of each series -----------------------------------------

ROUTE = "/v1/chat/completions"


def bucket_exemplars(metrics: Metrics) -> dict[str, tuple[str, float]]:
    """The request duration's exemplars, by bucket: (trace id, value)."""
    return {s.labels["le"]: (s.exemplar.labels[names.EXEMPLAR_TRACE_ID], s.exemplar.value)
            for family in metrics.registry.collect() for s in family.samples
            if s.name == f"{names.METRIC_REQUEST_DURATION}_bucket" and s.exemplar is not None}


def test_a_bucket_takes_one_exemplar_a_second() -> None:
    metrics = Metrics(CollectorRegistry())
    duration = metrics.request_series(ROUTE, 200).duration
    duration.observe(0.02, 0xA, now=100.0)
    duration.observe(0.021, 0xB, now=100.0 + EXEMPLAR_INTERVAL / 2)  # same bucket, too soon: observed plainly
    duration.observe(0.3, 0xC, now=100.0 + EXEMPLAR_INTERVAL / 2)  # another bucket: its own second
    assert bucket_exemplars(metrics) == {"0.025": (f"{0xA:032x}", 0.02), "0.5": (f"{0xC:032x}", 0.3)}
    duration.observe(0.022, 0xD, now=100.0 + EXEMPLAR_INTERVAL)
    assert bucket_exemplars(metrics)["0.025"] == (f"{0xD:032x}", 0.022)
    assert metrics.registry.get_sample_value(f"{names.METRIC_REQUEST_DURATION}_count", {"route": ROUTE}) == 4


def test_an_observation_without_a_trace_leaves_the_bucket_free() -> None:
    metrics = Metrics(CollectorRegistry())
    duration = metrics.request_series(ROUTE, 200).duration
    duration.observe(0.02, None, now=100.0)  # a trace nobody keeps: no exemplar, and no turn taken
    duration.observe(0.02, 0xA, now=100.0)
    assert bucket_exemplars(metrics) == {"0.025": (f"{0xA:032x}", 0.02)}


def test_the_limit_is_per_series_shared_by_every_status() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.request_series(ROUTE, 200).duration.observe(0.02, 0xA, now=100.0)
    metrics.request_series(ROUTE, 500).duration.observe(0.02, 0xB, now=100.1)  # the same duration series
    metrics.request_series("/v1/responses", 200).duration.observe(0.02, 0xC, now=100.1)  # another series
    found = {(s.labels["route"], s.labels["le"]): s.exemplar.labels[names.EXEMPLAR_TRACE_ID]
             for family in metrics.registry.collect() for s in family.samples
             if s.name == f"{names.METRIC_REQUEST_DURATION}_bucket" and s.exemplar is not None}
    assert found == {(ROUTE, "0.025"): f"{0xA:032x}", ("/v1/responses", "0.025"): f"{0xC:032x}"}


@pytest.mark.parametrize("value", [0.0, *REQUEST_DURATION_BUCKETS, 0.0051, 1e9])
def test_the_exemplar_lands_in_the_bucket_prometheus_counts_the_value_in(value: float) -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.request_series(ROUTE, 200).duration.observe(value, 0xA, now=100.0)
    [(bucket, _)] = bucket_exemplars(metrics).items()
    counted = [s.labels["le"] for family in metrics.registry.collect() for s in family.samples
               if s.name == f"{names.METRIC_REQUEST_DURATION}_bucket" and s.value == 1]
    assert bucket == counted[0]  # the first (lowest) bucket that counts it


@pytest.mark.parametrize("bound", REQUEST_DURATION_BUCKETS)
def test_the_limiter_takes_turns_by_the_buckets_prometheus_counts_in(bound: float) -> None:
    """A value on a bucket's bound and one just above it fall in two buckets: each takes its own
    exemplar within the same second."""
    metrics = Metrics(CollectorRegistry())
    duration = metrics.request_series(ROUTE, 200).duration
    duration.observe(bound, 0xA, now=100.0)
    duration.observe(bound * 1.0001, 0xB, now=100.0)
    assert sorted(trace for trace, _ in bucket_exemplars(metrics).values()) == [f"{0xA:032x}", f"{0xB:032x}"]
