"""The message cap for MCP servers over streamable HTTP (gateway.mcp.http_limits), against
tests/mcp/servers/flood.py: an answer over the cap fails its call, unread, and the next call works."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import AsyncIterator

import pytest

from gateway.mcp.connection import UNAVAILABLE
from tests.conftest import StackFactory
from tests.mcp.conftest import FLOOD_SERVER, HttpServer, Recorded, assert_counted, connection, invoke

pytestmark = pytest.mark.slow  # an MCP server as a process


@pytest.fixture(params=["json", "sse"])
async def http_flood_server(request: pytest.FixtureRequest, recorded: Recorded) -> AsyncIterator[HttpServer]:
    """The server over streamable HTTP, answering with JSON bodies or with SSE streams."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(FLOOD_SERVER), "http", request.param, stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "RECORD": str(recorded.path)})
    assert process.stdout is not None
    port = int(await asyncio.wait_for(process.stdout.readline(), 30))
    server = HttpServer(f"http://127.0.0.1:{port}/mcp", process)
    yield server
    await server.stop()


async def test_an_http_answer_over_the_cap_fails_its_call_unread_and_the_next_call_works(
        make_stack: StackFactory, http_flood_server: HttpServer, request: pytest.FixtureRequest,
        caplog: pytest.LogCaptureFixture) -> None:
    """Against the default cap (8 MiB): 2 MB is delivered, JSON or SSE (the client's own limit
    on an SSE event, 1 MiB, is raised to the cap); 9 MB fails its call. A JSON answer fails it
    alone, the session staying; an SSE one as a broken stream, which the gateway answers by
    opening the session again. Either way the log names the limit."""
    stack = await make_stack(mcp_servers={"flood": {"url": http_flood_server.url, "ping_interval_seconds": 0,
                                                    "reconnect_min_seconds": 0.05}})
    source = connection(stack, "flood")
    within = await invoke(stack, "big", size=2_000_000)
    assert (within["status"], len(within["content"])) == ("ok", 2_000_000)
    sse = request.node.callspec.id == "sse"
    with caplog.at_level(logging.WARNING, logger="toolspan.mcp"):
        over = await invoke(stack, "big", size=9_000_000)
        async with asyncio.timeout(20):
            await source.wait_until(lambda c: c.disconnects == sse and c.state == "up")
    assert over["status"] == "error"
    logged = [r.getMessage() for r in caplog.records]
    if sse:
        assert over["error_type"] == UNAVAILABLE
        assert any("exceeded the 8388608 byte limit" in line for line in logged), logged
    else:
        assert over["content"].endswith("the server's answer is longer than 8388608 bytes (mcp_max_message_bytes)")
        assert any("longer than 8388608 bytes (mcp_max_message_bytes)" in line for line in logged), logged
    assert (await invoke(stack, "echo", text="still here"))["content"] == "still here"
    assert_counted(stack, {("flood__big", "ok"): 1, ("flood__big", "error"): 1, ("flood__echo", "ok"): 1})
