"""MCP servers hard on the client listing their tools (tests/mcp/servers/hostile.py): a tool with an
unusable schema is left out and the rest serve; announcements of changed tools are coalesced and
rebuild only what changed; a server's tools are capped."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.http.keys import REGISTRY
from gateway.mcp import McpConnection
from tests.conftest import Stack, StackFactory
from tests.mcp.conftest import Recorded, connection, served_over_http

pytestmark = pytest.mark.slow  # MCP servers as processes

HOSTILE_SERVER = Path(__file__).parent / "servers" / "hostile.py"


def hostile_stdio(recorded: Recorded, *args: str, **settings: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(HOSTILE_SERVER), *args], "env": {"RECORD": str(recorded.path)},
            "ping_interval_seconds": 0, **settings}


@contextlib.asynccontextmanager
async def hostile_http(recorded: Recorded, *args: str) -> AsyncIterator[str]:
    """The server over streamable HTTP: its URL."""
    async with served_over_http(HOSTILE_SERVER, *args, env={"RECORD": str(recorded.path)}) as url:
        yield url


@pytest.mark.parametrize("transport", ["stdio", "streamable_http"])
async def test_a_tool_with_an_unusable_schema_is_left_out_and_the_rest_serve(
        make_stack: StackFactory, recorded: Recorded, caplog: pytest.LogCaptureFixture, transport: str) -> None:
    async with contextlib.AsyncExitStack() as servers:
        if transport == "stdio":
            server = hostile_stdio(recorded, "badschema")
        else:
            server = {"url": await servers.enter_async_context(hostile_http(recorded, "badschema")),
                      "ping_interval_seconds": 0}
        with caplog.at_level(logging.WARNING, logger="toolspan.mcp"):
            stack = await make_stack(mcp_servers={"hostile": server})
        await answers_and_warns(stack, caplog)


async def answers_and_warns(stack: Stack, caplog: pytest.LogCaptureFixture) -> None:
    source = connection(stack, "hostile")
    assert (source.state, source.tools) == ("up", ("hostile__echo",))
    async with stack.http.post("/v1/tools/hostile__echo/invoke", json={"arguments": {"text": "hi"}}) as response:
        assert (await response.json())["content"] == "echo: {'text': 'hi'}"
    left_out = sorted(r.getMessage() for r in caplog.records if "left out" in r.getMessage())
    assert len(left_out) == 3
    # The protocol's schema lets a list of properties through; the gateway's check of the tool does not.
    assert left_out[0] == ("MCP server 'hostile': tool 'listed' left out: tool 'hostile__listed': "
                           "parameters_schema properties must be an object")
    assert left_out[1] == "MCP server 'hostile': tool 'scalar' left out: inputSchema.type: Input should be 'object'"
    assert left_out[2] == "MCP server 'hostile': tool number 4 (it has no name) left out: name: Field required"


async def test_announcements_faster_than_the_minimum_interval_get_one_listing_each_interval(
        make_stack: StackFactory, recorded: Recorded, caplog: pytest.LogCaptureFixture) -> None:
    """The server announces a change every 20 ms; the gateway lists its tools at most once per
    relist_min_seconds (0.3 s here), and builds again only the one tool whose description changed:
    the others are the very Tools it built at first. What each listing leaves out (past
    max_tools) is said once, not once per listing."""
    caplog.set_level(logging.WARNING, logger="toolspan.mcp")
    stack = await make_stack(mcp_servers={"hostile": hostile_stdio(recorded, "churn", "40", "0.02",
                                                                   relist_min_seconds=0.3, max_tools=30)})
    source = connection(stack, "hostile")
    registry = stack.http.server.app[REGISTRY]
    first = {name: registry.get(name) for name in source.tools}
    assert len(first) == 30
    started = asyncio.get_running_loop().time()
    seen: list[str] = []

    def relisted_thrice(c: McpConnection) -> bool:
        tool = registry.get("hostile__t0")
        described = tool.description if tool is not None else ""
        if not seen or seen[-1] != described:
            seen.append(described)
        return len(seen) >= 4

    await asyncio.wait_for(source.wait_until(relisted_thrice), 30)
    elapsed = asyncio.get_running_loop().time() - started
    listings = [entry["listed"] for entry in recorded.entries() if "listed" in entry]
    announced = listings[-1]
    # Every listing after the first came at least 0.3 s after the one before.
    assert len(listings) - 1 <= elapsed / 0.3 + 1
    assert announced >= 3 * (len(listings) - 1)  # many announcements per listing
    unchanged = {name: tool for name, tool in first.items() if name != "hostile__t0"}
    assert all(registry.get(name) is tool for name, tool in unchanged.items())
    assert registry.get("hostile__t0") is not first["hostile__t0"]
    assert sum("max_tools" in r.getMessage() for r in caplog.records) == 1


async def test_a_server_listing_more_than_max_tools_keeps_the_first(
        make_stack: StackFactory, recorded: Recorded, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="toolspan.mcp"):
        stack = await make_stack(mcp_servers={"hostile": hostile_stdio(recorded, "churn", "30", "3600",
                                                                       max_tools=10)})
    source = connection(stack, "hostile")
    assert source.tools == ("hostile__echo", *(f"hostile__t{i}" for i in range(9)))
    async with stack.http.get("/v1/tools") as response:
        offered = {t["function"]["name"] for t in (await response.json())["data"]}
    assert offered >= set(source.tools)
    assert not offered & {f"hostile__t{i}" for i in range(9, 30)}
    [warning] = [r.getMessage() for r in caplog.records if "max_tools" in r.getMessage()]
    assert warning == "MCP server 'hostile': it lists more than 10 tools: the first 10 are kept (max_tools)"
