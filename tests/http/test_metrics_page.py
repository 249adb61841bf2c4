"""/metrics of one worker among several: its own metrics and the others', read over their unix
sockets, as one page; a worker that does not answer makes the scrape a 503, never a partial sum."""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families as parse_classic
from pytest_aiohttp import AiohttpClient

from gateway.app import create_app
from gateway.http.metrics_page import OwnMetrics, WorkersMetrics, serving_own_metrics
from gateway.settings.model import Settings
from gateway.state import MemoryState
from gateway.tools import ToolRegistry
from telemetry import names
from telemetry.instrument import Telemetry
from telemetry.merge import merged_page
from telemetry.metrics import Metrics
from telemetry.tracing import build_provider, tracer_of

CHAT = "/v1/chat/completions"
SETTINGS = Settings(upstream="http://127.0.0.1:9/v1", trajectory_store=False)


def worker_telemetry(requests: int) -> Telemetry:
    """One worker's telemetry, having answered `requests` chat requests."""
    metrics = Metrics(CollectorRegistry())
    metrics.requests.labels(CHAT, "200").inc(requests)
    return Telemetry(tracer_of(build_provider()), metrics)


@pytest.fixture
def run_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="tsm-") as path:  # short: unix socket paths are limited
        yield Path(path)


@pytest.fixture
async def exits() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as stack:
        yield stack


async def scrape(aiohttp_client: AiohttpClient, telemetry: Telemetry, page: WorkersMetrics) -> tuple[int, str, dict[
        str, str]]:
    app = create_app(SETTINGS, ToolRegistry(), telemetry, MemoryState(10, 60.0), metrics_page=page)
    client = await aiohttp_client(app)
    async with client.get("/metrics") as response:
        return response.status, await response.text(), dict(response.headers)


async def test_the_page_sums_this_worker_and_the_others(aiohttp_client: AiohttpClient, run_dir: Path,
                                                        exits: AsyncExitStack) -> None:
    peers = [run_dir / "worker-1.sock", run_dir / "worker-2.sock"]
    for socket, requests in zip(peers, (3, 4), strict=True):
        await exits.enter_async_context(serving_own_metrics(OwnMetrics(worker_telemetry(requests)), socket))
    own = worker_telemetry(2)
    status, text, _ = await scrape(aiohttp_client, own, WorkersMetrics(OwnMetrics(own), peers, merged_page))
    assert status == 200
    [requests] = [s.value for f in parse_classic(text) for s in f.samples
                  if s.name == names.METRIC_REQUESTS and s.labels == {"route": CHAT, "status": "200"}]
    assert requests == 2 + 3 + 4


async def test_a_worker_that_is_gone_makes_the_scrape_a_503(aiohttp_client: AiohttpClient, run_dir: Path,
                                                            exits: AsyncExitStack) -> None:
    here = run_dir / "worker-1.sock"
    await exits.enter_async_context(serving_own_metrics(OwnMetrics(worker_telemetry(3)), here))
    own = worker_telemetry(2)
    page = WorkersMetrics(OwnMetrics(own), [here, run_dir / "worker-2.sock"], merged_page)
    status, text, headers = await scrape(aiohttp_client, own, page)
    assert status == 503
    assert headers["Retry-After"] == "1"
    error = json.loads(text)["error"]
    assert (error["type"], error["code"]) == ("server_error", "metrics_incomplete")
    assert "worker-2 did not answer" in error["message"]
    assert "worker-1" not in error["message"]


async def test_a_worker_that_does_not_answer_in_time_makes_the_scrape_a_503(
        aiohttp_client: AiohttpClient, run_dir: Path) -> None:
    silent = run_dir / "worker-1.sock"
    hung_up = asyncio.Event()

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the scrape gives up and hangs up
        writer.close()
        hung_up.set()

    server = await asyncio.start_unix_server(never_answer, str(silent))
    own = worker_telemetry(2)
    async with server:
        status, text, _ = await scrape(aiohttp_client, own, WorkersMetrics(OwnMetrics(own), [silent], merged_page,
                                                                           timeout=0.2))
        await asyncio.wait_for(hung_up.wait(), 10)  # the scrape had connected, and left when its time was up
    assert status == 503
    assert "worker-1 did not answer" in text
