"""The metrics of several workers as one page: counters and histograms summed per label set,
gauges summed but `*_up` gauges at their minimum, the earliest `_created`, the most recent
exemplar of each bucket; rendered in either exposition format."""

from __future__ import annotations

import subprocess

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_page
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_classic
from prometheus_client.samples import Sample

from telemetry import names
from telemetry.merge import OPENMETRICS, merge, merged_page
from telemetry.metrics import Metrics
from tests.test_deploy import promtool

CHAT = "/v1/chat/completions"
TOOLS = "/v1/tools"


def value(samples: list[Sample], name: str, **labels: str) -> float:
    [found] = [s.value for s in samples if s.name == name and s.labels == labels]
    return found


def samples_of(page: bytes, classic: bool = False) -> list[Sample]:
    families = parse_classic(page.decode()) if classic else parse_openmetrics(page.decode())
    return [sample for family in families for sample in family.samples]


def worker(requests: dict[tuple[str, str], int], durations: dict[str, list[float]], in_flight: int,
           state_up: bool, traces: int) -> Metrics:
    """A worker's metrics; its requests' traces are numbered from `traces` (each route's from 0)."""
    metrics = Metrics(CollectorRegistry())
    for (route, status), count in requests.items():
        metrics.requests.labels(route, status).inc(count)
    for route, seconds in durations.items():
        for n, duration in enumerate(seconds):
            metrics.request_duration.labels(route).observe(duration, traces + n, now=0.0)
    metrics.in_flight.set(in_flight)
    metrics.state_store_shared()  # both on one Redis
    metrics.state_store_up.set(1 if state_up else 0)
    metrics.mcp_server_up.labels("files").set(1)
    return metrics


@pytest.fixture
def two_workers() -> tuple[Metrics, Metrics]:
    first = worker({(CHAT, "200"): 2, (TOOLS, "200"): 1}, {CHAT: [0.02, 0.3]}, in_flight=2, state_up=True,
                   traces=0x100)
    second = worker({(CHAT, "200"): 3, (CHAT, "503"): 1}, {CHAT: [0.02, 7.0], TOOLS: [0.001]}, in_flight=3,
                    state_up=False, traces=0x200)
    return first, second


def test_counters_and_histograms_are_summed_per_label_set(two_workers: tuple[Metrics, Metrics]) -> None:
    page, _ = merged_page([openmetrics_page(m.registry) for m in two_workers], OPENMETRICS)
    samples = samples_of(page)
    requests = names.METRIC_REQUESTS
    assert value(samples, requests, route=CHAT, status="200") == 5
    assert value(samples, requests, route=TOOLS, status="200") == 1  # on one worker only
    assert value(samples, requests, route=CHAT, status="503") == 1
    duration = names.METRIC_REQUEST_DURATION
    assert value(samples, f"{duration}_count", route=CHAT) == 4
    assert value(samples, f"{duration}_sum", route=CHAT) == pytest.approx(0.02 + 0.3 + 0.02 + 7.0)
    assert value(samples, f"{duration}_bucket", route=CHAT, le="0.025") == 2
    assert value(samples, f"{duration}_bucket", route=CHAT, le="0.5") == 3
    assert value(samples, f"{duration}_bucket", route=CHAT, le="10.0") == 4
    assert value(samples, f"{duration}_bucket", route=CHAT, le="+Inf") == 4
    assert value(samples, f"{duration}_count", route=TOOLS) == 1


def test_gauges_are_summed_and_up_gauges_take_the_minimum(two_workers: tuple[Metrics, Metrics]) -> None:
    page, _ = merged_page([openmetrics_page(m.registry) for m in two_workers], OPENMETRICS)
    samples = samples_of(page)
    assert value(samples, names.METRIC_REQUESTS_IN_FLIGHT) == 5
    assert value(samples, names.METRIC_STATE_STORE_UP) == 0  # down on one worker: down
    assert value(samples, names.METRIC_MCP_SERVER_UP, server="files") == 1


def test_a_series_started_when_its_first_worker_started_it(two_workers: tuple[Metrics, Metrics]) -> None:
    pages = [openmetrics_page(m.registry) for m in two_workers]
    created = f"{names.METRIC_REQUESTS.removesuffix('_total')}_created"
    each = [value(samples_of(p), created, route=CHAT, status="200") for p in pages]
    assert value(samples_of(merged_page(pages, OPENMETRICS)[0]), created, route=CHAT, status="200") == min(each)


def test_each_bucket_keeps_its_most_recent_exemplar(two_workers: tuple[Metrics, Metrics]) -> None:
    page, content_type = merged_page([openmetrics_page(m.registry) for m in two_workers], OPENMETRICS)
    assert content_type.startswith("application/openmetrics-text")
    buckets = {s.labels["le"]: (s.exemplar.labels[names.EXEMPLAR_TRACE_ID], s.exemplar.value) if s.exemplar else None
               for s in samples_of(page)
               if s.name == f"{names.METRIC_REQUEST_DURATION}_bucket" and s.labels["route"] == CHAT}
    # Both workers saw a request of 0.02 s: the bucket shows the second's, observed later.
    assert buckets["0.025"] == (f"{0x200:032x}", 0.02)
    assert buckets["0.5"] == (f"{0x101:032x}", 0.3)
    assert buckets["10.0"] == (f"{0x201:032x}", 7.0)
    assert buckets["0.005"] is None


EXEMPLAR_PAGE = """# TYPE t histogram
t_bucket{{le="1.0"}} 1 # {{trace_id="{trace}"}} 0.5 {time}
t_bucket{{le="+Inf"}} 1
t_count 1
t_sum 0.5
# EOF
"""


@pytest.mark.parametrize("newest_first", [False, True], ids=["newest-last", "newest-first"])
def test_the_most_recent_exemplar_wins_whichever_page_has_it(newest_first: bool) -> None:
    older = EXEMPLAR_PAGE.format(trace="aa" * 16, time="1700000000.000000001")
    newer = EXEMPLAR_PAGE.format(trace="bb" * 16, time="1700000000.000000002")
    [family] = merge([newer, older] if newest_first else [older, newer])
    [bucket] = [s for s in family.samples if s.labels.get("le") == "1.0"]
    assert bucket.value == 2
    assert bucket.exemplar is not None
    assert bucket.exemplar.labels == {"trace_id": "bb" * 16}


def test_one_page_merges_into_itself(two_workers: tuple[Metrics, Metrics]) -> None:
    page = openmetrics_page(two_workers[0].registry)
    assert list(parse_openmetrics(merged_page([page], OPENMETRICS)[0].decode())) == list(parse_openmetrics(
        page.decode()))


def test_the_classic_format_for_scrapers_that_do_not_ask_for_openmetrics(two_workers: tuple[Metrics, Metrics]) -> None:
    pages = [openmetrics_page(m.registry) for m in two_workers]
    for accept in (None, "text/plain", "application/openmetrics-text; version=bogus"):
        page, content_type = merged_page(pages, accept)
        assert content_type.startswith("text/plain; version=0.0.4")
        samples = samples_of(page, classic=True)
        assert value(samples, names.METRIC_REQUESTS, route=CHAT, status="200") == 5
        assert value(samples, f"{names.METRIC_REQUEST_DURATION}_count", route=CHAT) == 4
        assert " # {" not in page.decode()  # no exemplars in this format
    run = subprocess.run([promtool(), "check", "metrics"], input=merged_page(pages, None)[0], capture_output=True,
                         timeout=60, check=False)
    assert run.returncode == 0, (run.stdout + run.stderr).decode()


def test_a_family_of_two_types_is_refused() -> None:
    with pytest.raises(ValueError, match="is a counter on one page and a gauge on another"):
        merge(["# TYPE x counter\nx_total 1\n# EOF\n", "# TYPE x gauge\nx 1\n# EOF\n"])
