"""The stdio transport (gateway.mcp.stdio) and messages beyond `mcp_max_message_bytes`
(tests/mcp/servers/flood.py): the connection is dropped rather than the line buffered, and the
gateway reconnects; the next call works, and every call has its span and its count. (Over
streamable HTTP: tests/mcp/test_http_limits.py.)"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

import pytest

from gateway.mcp.connection import UNAVAILABLE
from telemetry import names
from tests.conftest import StackFactory
from tests.mcp.conftest import FLOOD_SERVER, Recorded, assert_counted, connection, invoke

pytestmark = pytest.mark.slow  # MCP servers as processes, one flooding 32 MB

CAP = 256 * 1024  # small enough for quick tests; the 32 MB flood runs against the default


def flood_server(recorded: Recorded, **settings: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(FLOOD_SERVER)], "env": {"RECORD": str(recorded.path)},
            "ping_interval_seconds": 0, "reconnect_min_seconds": 0.05, "timeout_seconds": 10, **settings}


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
