"""/mcp beside responses_mcp_servers: the gateway's own MCP server still answers the official `mcp`
client at 2026-07-28 (discovery, no session) and a 2025-06-18 client (initialize, a session): it
lists and calls, a rejected call is an `isError` result with the did-you-mean, and the calls of one
X-Trajectory-Id are one trajectory. The tools of a server a Responses request may declare are
registered, yet neither listed nor callable there: they are offered only to a request that
declares their server."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mcp import MCPError
from mcp_types import INVALID_PARAMS

from gateway.http.keys import REGISTRY, RESPONSES_MCP_SOURCES
from telemetry import names
from tests.conftest import Stack, StackFactory
from tests.e2e.test_mcp_server import INITIALIZE, MCP_HEADERS, attrs, calls, mcp_client, text
from tests.mcp.conftest import HttpServer, Recorded, files, http_server, recorded

__all__ = ["files", "http_server", "recorded"]  # the fixtures of tests/mcp, used here

pytestmark = pytest.mark.slow

DECLARABLE = "files__read_file"  # a tool of the server in responses_mcp_servers
WRONG = {"file_path": "/etc/hosts"}  # read_file's parameter is `path`


@pytest.fixture
async def stack(make_stack: StackFactory, files: tuple[HttpServer, Recorded]) -> Stack:
    server, _ = files
    stack = await make_stack(upstream_kind="anthropic", responses_mcp_servers={"files": {"url": server.url}})
    app = stack.http.server.app
    assert app is not None
    await app[RESPONSES_MCP_SOURCES].connections["files"].wait_until(lambda c: c.state == "up")
    registry = app[REGISTRY]
    assert registry.get(DECLARABLE) is not None
    assert registry.on_request(DECLARABLE)
    return stack


async def test_a_2026_07_28_client_lists_calls_and_is_told_the_did_you_mean(
        stack: Stack, files: tuple[HttpServer, Recorded]) -> None:
    _, recorded = files
    async with mcp_client(stack, key=None, mode="2026-07-28", **{"X-Trajectory-Id": "run-2026"}) as (client, seen):
        listed = [tool.name for tool in (await client.list_tools()).tools]
        rejected = await client.call_tool("read_file", WRONG)
        repaired = await client.call_tool("read_file", {"path": "/etc/hosts"})
        with pytest.raises(MCPError) as hidden:
            await client.call_tool(DECLARABLE, {"path": "/etc/hosts"})
    assert not seen.header("mcp-session-id")  # no session at this revision
    assert listed == ["read_file", "add"]
    assert rejected.is_error
    assert "Unrecognized: file_path (did you mean 'path'?)" in text(rejected)
    assert (repaired.is_error, text(repaired)) == (False, "contents of /etc/hosts")
    assert hidden.value.error.code == INVALID_PARAMS
    assert DECLARABLE not in hidden.value.error.message.partition("Available tools:")[2]
    assert recorded.calls() == []
    spans = calls(stack)  # type: ignore[arg-type]
    assert [(attrs(s)[names.ATTR_TOOL_NAME], attrs(s)[names.ATTR_OUTCOME]) for s in spans[:2]] == [
        ("read_file", "rejected"), ("read_file", "ok")]
    assert {attrs(s)[names.ATTR_CONVERSATION_ID] for s in spans} == {"run-2026"}


def answer_of(body: str, content_type: str) -> dict[str, Any]:
    """The JSON-RPC answer of one POST, sent as JSON or as one event of a stream."""
    if content_type == "application/json":
        answer: dict[str, Any] = json.loads(body)
        return answer
    [data] = [line[len("data: "):] for line in body.splitlines() if line.startswith("data: ")]
    answer = json.loads(data)
    return answer


async def test_a_2025_06_18_client_lists_calls_and_is_told_the_did_you_mean(
        stack: Stack, files: tuple[HttpServer, Recorded]) -> None:
    _, recorded = files
    headers = {**MCP_HEADERS, "X-Trajectory-Id": "run-2025"}
    opened = await stack.http.post("/mcp", json=INITIALIZE, headers=headers)
    assert opened.status == 200
    initialized = answer_of(await opened.text(), opened.content_type)
    assert initialized["result"]["protocolVersion"] == "2025-06-18"
    session = {**headers, "Mcp-Session-Id": opened.headers["Mcp-Session-Id"], "Mcp-Protocol-Version": "2025-06-18"}
    notified = await stack.http.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                                     headers=session)
    assert notified.status == 202

    async def ask(number: int, method: str, **params: Any) -> dict[str, Any]:
        sent = await stack.http.post("/mcp", json={"jsonrpc": "2.0", "id": number, "method": method,
                                                   "params": params}, headers=session)
        assert sent.status == 200
        return answer_of(await sent.text(), sent.content_type)

    listed = await ask(2, "tools/list")
    rejected = await ask(3, "tools/call", name="read_file", arguments=WRONG)
    repaired = await ask(4, "tools/call", name="read_file", arguments={"path": "/etc/hosts"})
    hidden = await ask(5, "tools/call", name=DECLARABLE, arguments={"path": "/etc/hosts"})
    assert [tool["name"] for tool in listed["result"]["tools"]] == ["read_file", "add"]
    assert rejected["result"]["isError"] is True
    assert "Unrecognized: file_path (did you mean 'path'?)" in rejected["result"]["content"][0]["text"]
    assert repaired["result"]["isError"] is False
    assert repaired["result"]["content"][0]["text"] == "contents of /etc/hosts"
    assert hidden["error"]["code"] == INVALID_PARAMS
    assert DECLARABLE not in hidden["error"]["message"].partition("Available tools:")[2]
    assert recorded.calls() == []
    spans = calls(stack)  # type: ignore[arg-type]
    assert {attrs(s)[names.ATTR_CONVERSATION_ID] for s in spans} == {"run-2025"}
    assert [attrs(s).get(names.ATTR_RETRY_KIND) for s in spans[:2]] == [None, "corrected"]
