"""What GET /metrics answers: this process's metrics, or, with `toolspan serve --workers N`, every
worker's as one page.

Each worker also serves its own metrics (OpenMetrics, exemplars included) on a unix socket in the
supervisor's run directory, at GET /metrics (`curl --unix-socket <socket> http://worker/metrics`
shows one worker alone). The worker a scrape lands on reads the others' at once over their
sockets, within a short time limit, and merges them with its own (the merge is handed in by the
composition root: telemetry.merge). When a worker does not answer, the scrape gets a 503: a sum
short of one worker's counts would look like a counter reset to Prometheus.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Protocol

import aiohttp
from aiohttp import web

from gateway.errors import Unavailable
from gateway.instrumentation import Instrumentation

OPENMETRICS = "application/openmetrics-text; version=1.0.0"  # the format a worker's own page is read in
PEER_TIMEOUT_SECONDS = 2.0  # for every other worker's page; Prometheus's scrape timeout is 10 s by default
Merge = Callable[[Sequence[bytes], str | None], tuple[bytes, str]]  # OpenMetrics pages, Accept -> page, type


class MetricsPage(Protocol):
    async def __call__(self, accept: str | None) -> tuple[bytes, str]:
        """The page and its content type, in the format `accept` asks for."""


class OwnMetrics:
    """This process's metrics alone: the page of one gateway, and each worker's share."""

    def __init__(self, instrumentation: Instrumentation) -> None:
        self._instrumentation = instrumentation

    async def __call__(self, accept: str | None) -> tuple[bytes, str]:
        return self._instrumentation.exposition(accept)

    def openmetrics(self) -> bytes:
        return self._instrumentation.exposition(OPENMETRICS)[0]


class WorkersMetrics:
    """Every worker's metrics as one page: this one's, and the others' read over `peers` (their
    sockets), merged by `merge`."""

    def __init__(self, own: OwnMetrics, peers: Sequence[Path], merge: Merge,
                 timeout: float = PEER_TIMEOUT_SECONDS) -> None:
        self._own = own
        self._peers = peers
        self._merge = merge
        self._timeout = timeout

    async def __call__(self, accept: str | None) -> tuple[bytes, str]:
        read = await asyncio.gather(*(self._read(peer) for peer in self._peers), return_exceptions=True)
        silent = [peer.stem for peer, page in zip(self._peers, read, strict=True) if isinstance(page, BaseException)]
        if silent:
            raise Unavailable(f"the metrics of every worker make one page, and {', '.join(silent)} did not answer; "
                              "a page without them would look like a counter reset", code="metrics_incomplete")
        return self._merge([self._own.openmetrics(), *(page for page in read if isinstance(page, bytes))], accept)

    async def _read(self, peer: Path) -> bytes:
        timeout = aiohttp.ClientTimeout(total=self._timeout)
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(peer)), timeout=timeout) as session, \
                session.get("http://worker/metrics") as response:
            response.raise_for_status()
            return await response.read()


@contextlib.asynccontextmanager
async def serving_own_metrics(own: OwnMetrics, socket: Path) -> AsyncIterator[None]:
    """This worker's own page, at GET /metrics on the unix socket `socket`, until the block ends."""
    async def page(request: web.Request) -> web.Response:
        return web.Response(body=own.openmetrics(), headers={"Content-Type": OPENMETRICS})

    app = web.Application()
    app.router.add_get("/metrics", page)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.UnixSite(runner, str(socket)).start()
        yield
    finally:
        await runner.cleanup()
