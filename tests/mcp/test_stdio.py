"""Messages from MCP servers beyond `mcp_max_message_bytes` (tests/mcp/servers/flood.py): over
stdio the connection is dropped rather than the line buffered, and the gateway reconnects; over
streamable HTTP the answer fails its call, unread. Either way the next call works, and every call
has its span and its count."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.mcp.connection import UNAVAILABLE
from telemetry import names
from tests.conftest import Stack, StackFactory
from tests.mcp.conftest import HttpServer, Recorded, connection

FLOOD_SERVER = Path(__file__).parent / "servers" / "flood.py"
CAP = 256 * 1024  # small enough for quick tests; the 32 MB flood runs against the default


def flood_server(recorded: Recorded, **settings: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(FLOOD_SERVER)], "env": {"RECORD": str(recorded.path)},
            "ping_interval_seconds": 0, "reconnect_min_seconds": 0.05, "timeout_seconds": 10, **settings}


async def invoke(stack: Stack, tool: str, **arguments: Any) -> dict[str, Any]:
    async with stack.http.post(f"/v1/tools/flood__{tool}/invoke", json={"arguments": arguments}) as response:
        assert response.status == 200
        outcome: dict[str, Any] = await response.json()
        return outcome


def assert_counted(stack: Stack, expected: dict[tuple[str, str], int]) -> None:
    """Each call has its tool.call span and its count, with its outcome."""
    spans = [s for s in stack.spans() if s.name == names.SPAN_TOOL_CALL]
    seen: dict[tuple[str, str], int] = {}
    for span in spans:
        attributes = span.attributes or {}
        key = (str(attributes[names.ATTR_TOOL_NAME]), str(attributes[names.ATTR_OUTCOME]))
        seen[key] = seen.get(key, 0) + 1
    assert seen == expected
    for (tool, outcome), count in expected.items():
        assert stack.metric(names.METRIC_TOOL_CALLS, tool=tool, outcome=outcome) == count


async def test_32_mb_without_a_newline_drop_the_stdio_connection_and_the_next_call_works(
        make_stack: StackFactory, recorded: Recorded, caplog: pytest.LogCaptureFixture) -> None:
    """The server writes 32 MB with no newline before its answer. The gateway reads up to the
    default cap (8 MiB), drops the connection (the call says the server went, at once, not at
    its time limit), starts the server again, and the next call is answered."""
    stack = await make_stack(mcp_servers={"flood": flood_server(recorded)})
    source = connection(stack, "flood")
    with caplog.at_level(logging.WARNING, logger="toolspan.mcp"):
        flooded = await invoke(stack, "flood", size=32_000_000)
    assert (flooded["status"], flooded["error_type"]) == ("error", UNAVAILABLE)
    assert "during the call" in flooded["content"]
    assert any("longer than 8388608 bytes (mcp_max_message_bytes)" in r.getMessage() for r in caplog.records)
    async with asyncio.timeout(20):
        await source.wait_until(lambda c: c.disconnects == 1 and c.state == "up")
    assert (await invoke(stack, "echo", text="still here"))["content"] == "still here"
    assert len(recorded.pids()) == 2  # the server was started again: the old connection and its buffer are gone
    assert stack.metric(names.METRIC_MCP_SERVER_DISCONNECTS, server="flood") == 1
    assert_counted(stack, {("flood__flood", "error"): 1, ("flood__echo", "ok"): 1})


async def test_a_stdio_result_over_the_cap_drops_the_connection_and_one_within_it_is_delivered(
        make_stack: StackFactory, recorded: Recorded) -> None:
    stack = await make_stack(mcp_servers={"flood": flood_server(recorded)}, mcp_max_message_bytes=CAP)
    source = connection(stack, "flood")
    assert (await invoke(stack, "big", size=CAP - 1024))["content"] == "y" * (CAP - 1024)
    over = await invoke(stack, "big", size=CAP)  # its JSON-RPC envelope takes it over the cap
    assert (over["status"], over["error_type"]) == ("error", UNAVAILABLE)
    async with asyncio.timeout(20):
        await source.wait_until(lambda c: c.disconnects == 1 and c.state == "up")
    assert (await invoke(stack, "big", size=CAP - 1024))["status"] == "ok"
    assert_counted(stack, {("flood__big", "ok"): 2, ("flood__big", "error"): 1})


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
