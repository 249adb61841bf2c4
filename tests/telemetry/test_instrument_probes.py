"""Probes are not traffic (issue 35): a health check or a Prometheus scrape makes no span and is not
counted among the requests, unless `telemetry_count_probes` asks for it; traffic is traced and
counted as before."""

from __future__ import annotations

import pytest

from telemetry import names
from tests.conftest import Stack, StackFactory

PROBES = ("/healthz", "/readyz", "/metrics")
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def _probe(stack: Stack, path: str, **headers: str) -> dict[str, str]:
    async with stack.http.get(path, headers=headers) as response:
        assert response.status == 200, await response.text()
        return dict(response.headers)


def _counted(stack: Stack, route: str) -> float:
    return stack.metric(names.METRIC_REQUESTS, route=route, status="200")


@pytest.mark.parametrize("path", PROBES)
async def test_a_probe_makes_no_span_and_no_request_count(make_stack: StackFactory, path: str) -> None:
    stack = await make_stack()
    for _ in range(3):
        await _probe(stack, path)
    assert stack.spans() == []
    assert _counted(stack, path) == 0
    assert stack.metric(f"{names.METRIC_REQUEST_DURATION}_count", route=path) == 0
    page = await (await stack.http.get("/metrics")).text()
    assert f'route="{path}"' not in page  # no series for it on the page a dashboard reads


async def test_a_probe_still_names_the_callers_trace(make_stack: StackFactory) -> None:
    stack = await make_stack()
    assert "X-Trace-Id" not in await _probe(stack, "/healthz")  # no span: no made-up trace id
    assert (await _probe(stack, "/healthz", traceparent=TRACEPARENT))["X-Trace-Id"] == TRACEPARENT.split("-")[1]
    assert stack.spans() == []


async def test_traffic_beside_probes_is_traced_and_counted(make_stack: StackFactory) -> None:
    stack = await make_stack()
    await _probe(stack, "/metrics")
    async with stack.http.get("/v1/tools") as response:
        assert response.status == 200
        trace_id = response.headers["X-Trace-Id"]
    [span] = stack.spans(trace_id)
    assert span.name == "GET /v1/tools"
    assert _counted(stack, "/v1/tools") == 1
    assert [s.name for s in stack.spans()] == ["GET /v1/tools"]


@pytest.mark.parametrize("path", PROBES)
async def test_the_setting_counts_probes_as_requests(make_stack: StackFactory, path: str) -> None:
    stack = await make_stack(telemetry_count_probes=True)
    headers = await _probe(stack, path)
    [span] = stack.spans(headers["X-Trace-Id"])
    assert span.name == f"GET {path}"
    assert _counted(stack, path) == 1
