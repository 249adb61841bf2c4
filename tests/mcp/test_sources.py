"""MCP servers as tool sources, end to end: real MCP servers (tests/mcp/servers/files.py) over
stdio, streamable HTTP and the legacy SSE transport, the gateway with its scripted provider, the
official openai client."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from typing import Any

import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from gateway.demo.model import Reply
from gateway.mcp.connection import UNAVAILABLE
from telemetry import names
from tests.conftest import TEST_KEY, StackFactory, tool_messages, tool_outcomes
from tests.mcp.conftest import HttpServer, Recorded, connection, start_http_server, stdio_server

pytestmark = pytest.mark.slow  # MCP servers as processes (stdio, streamable HTTP, SSE)


async def test_its_tools_are_listed_and_offered_to_the_provider(make_stack: StackFactory,
                                                                files_server: dict[str, Any]) -> None:
    stack = await make_stack(mcp_servers={"files": files_server})
    async with stack.http.get("/v1/tools") as response:
        listed = {t["function"]["name"]: t["function"] for t in (await response.json())["data"]}
    assert {"read_file", "files__read_file", "files__fail", "files__hang", "files__grow"} <= set(listed)
    assert listed["files__read_file"]["description"] == "Read a file."
    assert listed["files__read_file"]["parameters"] == {
        "type": "object", "properties": {"path": {"type": "string"}, "offset": {"default": 0, "type": "integer"}},
        "required": ["path"]}
    stack.script.then(Reply(content="done"))
    await stack.ask(False, messages=[{"role": "user", "content": "hi"}])
    offered = {t["function"]["name"] for t in stack.upstream_requests[0]["tools"]}
    assert "files__read_file" in offered


async def test_a_chat_completion_runs_an_mcp_tool_with_trace_context(make_stack: StackFactory,
                                                                     files_server: dict[str, Any],
                                                                     recorded: Recorded) -> None:
    stack = await make_stack(mcp_servers={"files": files_server})
    stack.script.then(Reply(tool_calls=[("files__read_file", {"path": "notes.txt", "offset": 2})]),
                      Reply(content="It says hi."))
    answer = await stack.ask(False, messages=[{"role": "user", "content": "read notes"}])
    assert answer.content == "It says hi."
    [message] = tool_messages(stack.upstream_requests[1])
    assert message["content"] == "contents of notes.txt from 2"
    trace_id = answer.headers["x-trace-id"]
    assert tool_outcomes(stack, trace_id) == [("files__read_file", "ok")]
    [call] = recorded.calls()
    assert call["args"] == {"path": "notes.txt", "offset": 2}
    [execute] = [s for s in stack.spans(trace_id) if s.name == names.SPAN_TOOL_EXECUTE]
    # The server's work joins the trace, under the execute step of the call.
    assert call["meta"]["traceparent"].startswith(f"00-{trace_id}-{execute.context.span_id:016x}-")
    [span] = [s for s in stack.spans(trace_id) if s.name == names.SPAN_TOOL_CALL]
    attributes = span.attributes or {}
    assert attributes[names.ATTR_MCP_SERVER] == "files"
    assert attributes[names.ATTR_MCP_METHOD_NAME] == "tools/call"
    assert attributes[names.ATTR_MCP_TOOL_NAME] == "read_file"
    assert attributes[names.ATTR_NETWORK_TRANSPORT] == ("pipe" if "command" in files_server else "tcp")
    assert attributes[names.ATTR_MCP_PROTOCOL_VERSION] == connection(stack).protocol_version


async def test_a_renamed_argument_is_rejected_before_it_reaches_the_server(make_stack: StackFactory,
                                                                           files_server: dict[str, Any],
                                                                           recorded: Recorded) -> None:
    stack = await make_stack(mcp_servers={"files": files_server})
    stack.script.then(Reply(tool_calls=[("files__read_file", {"file_path": "a.txt", "offset": "two"})]),
                      Reply(content="sorry"))
    answer = await stack.ask(False, messages=[{"role": "user", "content": "read"}])
    [message] = tool_messages(stack.upstream_requests[1])
    assert message["content"] == "\n".join([
        "Tool 'files__read_file': 3 arguments do not fit the declared parameters.",
        "- path: missing (required)",
        "- file_path: not a parameter of this tool",
        "- offset: 'two' is not of type 'integer'",
        "Required parameters: path",
        "Missing: path",
        "Unrecognized: file_path (did you mean 'path'?)",
        "Accepted parameters: path, offset",
        "Fix every problem listed and call 'files__read_file' again."])
    assert recorded.calls() == []
    [span] = [s for s in stack.spans(answer.headers["x-trace-id"]) if s.name == names.SPAN_TOOL_CALL]
    attributes = span.attributes or {}
    assert attributes[names.ATTR_REJECTION_REASON] == "missing_arguments"
    assert list(attributes[names.ATTR_ARGS_SUGGESTIONS]) == ["file_path->path"]  # type: ignore[arg-type]
    assert {s.name for s in stack.spans(answer.headers["x-trace-id"])} >= {names.SPAN_TOOL_PARSE}
    assert names.SPAN_TOOL_EXECUTE not in {s.name for s in stack.spans(answer.headers["x-trace-id"])}


async def test_results_errors_and_timeouts(make_stack: StackFactory, files_server: dict[str, Any],
                                           recorded: Recorded) -> None:
    # 2 s: long enough for a first call over HTTP on a busy machine, short for the hang to end in.
    stack = await make_stack(mcp_servers={"files": {**files_server, "timeout_seconds": 2.0}})
    invoked = {}
    for tool in ("fail", "hang", "stats", "picture"):
        async with stack.http.post(f"/v1/tools/files__{tool}/invoke", json={"arguments": {}}) as response:
            assert response.status == 200
            invoked[tool] = await response.json()
    assert invoked["fail"]["status"] == "error"
    assert "the disk is full" in json.dumps(invoked["fail"]["content"])
    assert invoked["hang"]["status"] == "timeout"
    assert invoked["stats"]["status"] == "ok"
    assert invoked["stats"]["processed_content"] == {"files": 3, "bytes": 120}
    assert invoked["picture"]["content"] == [
        {"type": "text", "text": "a pixel:"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]
    assert [c["tool"] for c in recorded.calls()] == ["fail", "hang", "stats", "picture"]
    # The server is still there for the next call after one that timed out.
    async with stack.http.post("/v1/tools/files__read_file/invoke", json={"arguments": {"path": "x"}}) as response:
        assert (await response.json())["status"] == "ok"


async def test_a_list_changed_notification_updates_the_registry(make_stack: StackFactory,
                                                                files_server: dict[str, Any]) -> None:
    stack = await make_stack(mcp_servers={"files": files_server})
    source = connection(stack)
    assert "files__fresh" not in source.tools
    async with stack.http.post("/v1/tools/files__grow/invoke", json={"arguments": {}}) as response:
        assert (await response.json())["status"] == "ok"
    await source.wait_until(lambda c: "files__fresh" in c.tools)
    async with stack.http.get("/v1/tools") as response:
        assert "files__fresh" in {t["function"]["name"] for t in (await response.json())["data"]}
    async with stack.http.post("/v1/tools/files__fresh/invoke", json={"arguments": {}}) as response:
        assert (await response.json())["content"] == "fresh result"


async def test_a_killed_server_is_unavailable_then_reconnected(make_stack: StackFactory,
                                                               recorded: Recorded) -> None:
    stack = await make_stack(mcp_servers={"files": stdio_server(
        recorded, reconnect_min_seconds=0.05, ping_interval_seconds=0)})
    source = connection(stack)
    [first] = recorded.pids()
    async with stack.http.get("/readyz") as response:
        ready = await response.json()
    assert ready["mcp_servers"][0] | {"name": "files", "state": "up", "disconnects": 0} == ready["mcp_servers"][0]
    assert stack.metric(names.METRIC_MCP_SERVER_UP, server="files") == 1

    os.kill(first, signal.SIGKILL)
    await source.wait_until(lambda c: c.state == "down")
    stack.script.then(Reply(tool_calls=[("files__read_file", {"path": "a"})]), Reply(content="later"))
    await stack.ask(False, messages=[{"role": "user", "content": "read"}])
    [message] = tool_messages(stack.upstream_requests[1])
    assert message["content"].startswith("MCP server 'files' is unavailable")
    assert stack.metric(names.METRIC_TOOL_CALLS, tool="files__read_file", outcome="error") == 1
    assert stack.metric(names.METRIC_MCP_SERVER_DISCONNECTS, server="files") == 1

    await source.wait_until(lambda c: c.state == "up")
    assert len(recorded.pids()) == 2  # a new server process
    assert stack.metric(names.METRIC_MCP_SERVER_UP, server="files") == 1
    async with stack.http.post("/v1/tools/files__read_file/invoke", json={"arguments": {"path": "b"}}) as response:
        assert (await response.json())["status"] == "ok"
    async with stack.http.get("/readyz") as response:
        assert (await response.json())["mcp_servers"][0]["disconnects"] == 1


async def test_key_allowlists_hold_for_mcp_tools_on_v1_and_on_mcp(make_stack: StackFactory,
                                                                  recorded: Recorded) -> None:
    """A key allowed one MCP tool sees and runs only that one, whether its model calls it through
    /v1 or an MCP client calls it through the gateway's own /mcp."""
    stack = await make_stack(mcp_servers={"files": stdio_server(recorded)},
                             keys={"reader": {"key": TEST_KEY, "tools": ["files__read_file"]}})
    listed = await stack.client.get("/tools", cast_to=dict)  # type: ignore[type-var]
    assert [t["function"]["name"] for t in listed["data"]] == ["files__read_file"]
    stack.script.then(Reply(tool_calls=[("files__fail", {})]), Reply(content="cannot"))
    await stack.ask(False, messages=[{"role": "user", "content": "fail"}])
    [message] = tool_messages(stack.upstream_requests[1])
    assert message["content"].startswith("Tool 'files__fail' is not available to this caller.")
    assert recorded.calls() == []

    http = create_mcp_http_client(headers={"Authorization": f"Bearer {TEST_KEY}"})
    async with http, Client(streamable_http_client(f"{stack.url}/mcp", http_client=http), mode="legacy") as client:
        offered = [tool.name for tool in (await client.list_tools()).tools]
        result = await client.call_tool("files__read_file", {"path": "notes.txt"})
        with pytest.raises(MCPError, match="not available to this caller"):
            await client.call_tool("files__fail", {})
    assert offered == ["files__read_file"]
    assert (result.is_error, [getattr(block, "text", "") for block in result.content]) == (
        False, ["contents of notes.txt from 0"])
    assert [call["tool"] for call in recorded.calls()] == ["read_file"]


async def test_a_killed_http_server_is_unavailable_then_reconnected(make_stack: StackFactory, recorded: Recorded,
                                                                    http_server: HttpServer) -> None:
    stack = await make_stack(mcp_servers={"files": {
        "url": http_server.url, "reconnect_min_seconds": 0.05, "reconnect_max_seconds": 0.1,
        "ping_interval_seconds": 0}})
    source = connection(stack)
    assert source.state == "up"

    await http_server.stop()  # mid-session: the gateway may learn of it only from its next call
    async with stack.http.post("/v1/tools/files__read_file/invoke", json={"arguments": {"path": "a"}}) as response:
        assert response.status == 200
        outcome = await response.json()
    assert (outcome["status"], outcome["error_type"]) == ("error", UNAVAILABLE)
    assert outcome["content"].startswith("MCP server 'files' is unavailable")
    async with asyncio.timeout(10):  # a bound, so that a gateway that never notices fails the test
        await source.wait_until(lambda c: c.state == "down")
    assert stack.metric(names.METRIC_MCP_SERVER_DISCONNECTS, server="files") == 1
    assert stack.metric(names.METRIC_MCP_SERVER_UP, server="files") == 0
    async with stack.http.get("/readyz") as response:
        [status] = (await response.json())["mcp_servers"]
    assert status | {"name": "files", "state": "down", "transport": "tcp", "disconnects": 1} == status
    assert [call["tool"] for call in recorded.calls()] == []

    again = await start_http_server(recorded, http_server.port)  # the same URL, a new process
    try:
        async with asyncio.timeout(10):  # reconnecting on its own, within its backoff of 0.1 s at most
            await source.wait_until(lambda c: c.state == "up")
        async with stack.http.post("/v1/tools/files__read_file/invoke",
                                   json={"arguments": {"path": "b"}}) as response:
            assert (response.status, (await response.json())["status"]) == (200, "ok")
        assert [call["args"] for call in recorded.calls()] == [{"path": "b", "offset": 0}]
        assert len(recorded.pids()) == 2  # served by the new process
        assert stack.metric(names.METRIC_MCP_SERVER_UP, server="files") == 1
        async with stack.http.get("/readyz") as response:
            [status] = (await response.json())["mcp_servers"]
        assert status | {"state": "up", "disconnects": 1} == status
    finally:
        await again.stop()


async def test_an_idle_connection_stays_up_past_its_ping_interval(make_stack: StackFactory,
                                                                   files_server: dict[str, Any]) -> None:
    """Ping is gone from the protocol since 2026-07-28 (a server of that version answers it
    'Method not found'): the gateway pings only servers of the versions that have it, and a
    connection lasts however long it is idle."""
    stack = await make_stack(mcp_servers={"files": {**files_server, "ping_interval_seconds": 0.1}})
    source = connection(stack)
    with pytest.raises(TimeoutError):  # ten ping intervals without a lost connection
        await asyncio.wait_for(source.wait_until(lambda c: c.state != "up"), 1.0)
    assert source.disconnects == 0
