"""The servers of responses_mcp_servers end to end: a real MCP server (tests/mcp/servers/files.py
over streamable HTTP) is connected at start-up and its tools registered, yet offered to nobody
that did not declare it: not to a plain request, not by /v1/tools or /mcp, and a model that calls
one anyway is told there is no such tool, and the server receives nothing."""

from __future__ import annotations

import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from gateway.demo.model import Reply
from gateway.http.keys import REGISTRY, RESPONSES_MCP_SOURCES
from tests.conftest import Stack, StackFactory, tool_messages, tool_outcomes
from tests.mcp.conftest import HttpServer, Recorded

pytestmark = pytest.mark.slow  # an MCP server as a process of its own

FILES_TOOLS = {"files__read_file", "files__fail", "files__hang", "files__grow"}


@pytest.fixture
async def stack(make_stack: StackFactory, http_server: HttpServer) -> Stack:
    return await make_stack(responses_mcp_servers={"files": {"url": http_server.url, "label": "docs"}})


async def test_it_is_connected_at_start_up_and_its_tools_registered_on_request(stack: Stack) -> None:
    app = stack.http.app
    connection = app[RESPONSES_MCP_SOURCES].connections["files"]
    assert connection.state == "up"
    registry = app[REGISTRY]
    assert set(connection.tools) >= FILES_TOOLS
    assert all(registry.on_request(name) for name in connection.tools)
    tool = registry.get("files__read_file")
    assert tool is not None
    assert tool.origin is not None
    assert (tool.origin.server, tool.origin.remote_name) == ("files", "read_file")
    async with stack.http.get("/readyz") as response:
        ready = await response.json()
    [server] = ready["responses_mcp_servers"]
    assert (server["name"], server["state"], server["tools"]) == ("files", "up", len(connection.tools))


async def test_its_tools_are_offered_to_no_plain_request(stack: Stack) -> None:
    async with stack.http.get("/v1/tools") as response:
        listed = {spec["function"]["name"] for spec in (await response.json())["data"]}
    assert "read_file" in listed  # the gateway's own tools are there
    assert not listed & FILES_TOOLS
    stack.script.then(Reply(content="hi"), Reply(content="hi"))
    await stack.ask(False, messages=[{"role": "user", "content": "hi"}])
    await stack.respond(False, input="hi")
    chat, responses = stack.upstream_requests
    assert "read_file" in {spec["function"]["name"] for spec in chat["tools"]}
    assert not {spec["function"]["name"] for spec in chat["tools"]} & FILES_TOOLS
    assert not {spec["name"] for spec in responses["tools"]} & FILES_TOOLS


async def test_a_model_calling_one_undeclared_is_told_there_is_no_such_tool(stack: Stack,
                                                                            recorded: Recorded) -> None:
    stack.script.then(Reply(tool_calls=[("files__read_file", {"path": "notes.txt"})]), Reply(content="sorry"))
    answer = await stack.ask(False, messages=[{"role": "user", "content": "read notes"}])
    [told] = tool_messages(stack.upstream_requests[1])
    assert told["content"].startswith("There is no tool named 'files__read_file'.")
    assert not any(name in told["content"].split("Available tools:")[1] for name in FILES_TOOLS)
    assert tool_outcomes(stack, answer.headers["x-trace-id"]) == [("files__read_file", "rejected")]
    assert recorded.calls() == []


@pytest.mark.parametrize("step", ["invoke", "parse"])
async def test_invoke_and_parse_refuse_them_as_unknown(stack: Stack, recorded: Recorded, step: str) -> None:
    async with stack.http.post(f"/v1/tools/files__read_file/{step}", json={"arguments": {"path": "a"}}) as response:
        assert response.status == 404
        assert (await response.json())["error"]["code"] == "unknown_tool"
    assert recorded.calls() == []


async def test_the_mcp_endpoint_neither_lists_nor_runs_them(stack: Stack, recorded: Recorded) -> None:
    http = create_mcp_http_client()
    async with http, Client(streamable_http_client(f"{stack.url}/mcp", http_client=http)) as client:
        listed = {tool.name for tool in (await client.list_tools()).tools}
        assert "read_file" in listed
        assert not listed & FILES_TOOLS
        with pytest.raises(MCPError, match="There is no tool named 'files__read_file'") as refused:
            await client.call_tool("files__read_file", {"path": "a"})
    assert "files__" not in str(refused.value).split("Available tools:")[1]
    assert recorded.calls() == []
