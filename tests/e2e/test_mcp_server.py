"""The gateway as an MCP server: the official `mcp` client (and the Agents SDK's MCP support),
over real HTTP, against /mcp. Gateway keys authenticate it and their allowlists filter what it
lists and runs; each call is the executor's, with its `tool.call` span, metrics and retry
classification; the trajectory is the MCP session (or the X-Trajectory-Id header)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx2
import pytest
from agents.mcp import MCPServerStreamableHttp, MCPServerStreamableHttpParams
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types import INVALID_PARAMS, CallToolResult
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

from gateway.runtime.process import gateway as serve_gateway
from gateway.settings.model import Settings
from gateway.settings.parts import GatewayKey
from gateway.tools import Param, Rejection, Tool, ToolContext, ToolRegistry
from telemetry import names
from tests.conftest import Gateway, GatewayFactory, every_outcome_registry

READER_KEY = "sk-reader-key"  # may use read_file, add and stat
ADMIN_KEY = "sk-admin-key"  # may use every tool
KEYS = {"reader": GatewayKey(key=READER_KEY, tools=["read_file", "add", "stat"]), "admin": GatewayKey(key=ADMIN_KEY)}
LEGACY = "legacy"  # the 2025 protocol revisions: initialize, then a session (Mcp-Session-Id)
STATELESS = "auto"  # the client's default: 2026-07-28 when the server has it, one exchange per request
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "raw", "version": "0"}}}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def registry() -> ToolRegistry:
    """every_outcome_registry() and `stat`, whose dict result becomes structured content."""
    tools = every_outcome_registry()
    tools.register(Tool(name="stat", description="Size of a file", function=lambda a: {"path": a["path"], "size": 3},
                        parameters=[Param("path", "string", required=True)]))
    return tools


@dataclass
class Seen:
    """Headers of the gateway's answers to one client, in order."""

    responses: list[httpx2.Response] = field(default_factory=list)

    async def __call__(self, response: httpx2.Response) -> None:
        self.responses.append(response)

    def header(self, name: str) -> set[str]:
        return {r.headers[name] for r in self.responses if name in r.headers}


@asynccontextmanager
async def mcp_client(gateway: Gateway, key: str | None = READER_KEY, mode: str = LEGACY,
                     **headers: str) -> AsyncIterator[tuple[Client, Seen]]:
    """The official client on /mcp, sending `key` (and `headers`); what it saw comes beside it."""
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    seen = Seen()
    http = create_mcp_http_client(headers=headers)
    http.event_hooks["response"].append(seen)
    async with http, Client(streamable_http_client(f"{gateway.url}/mcp", http_client=http), mode=mode) as client:
        yield client, seen


@pytest.fixture
async def gateway(make_gateway: GatewayFactory) -> Gateway:
    # No provider is needed: nothing here asks a model.
    return await make_gateway(Settings(port=0, upstream="http://127.0.0.1:9/v1", keys=KEYS), registry())


def calls(gateway: Gateway) -> list[ReadableSpan]:
    return [s for s in gateway.spans() if s.name == names.SPAN_TOOL_CALL]


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def text(result: CallToolResult) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


@pytest.mark.parametrize("mode", [LEGACY, STATELESS])
async def test_lists_the_tools_its_key_allows_with_their_schemas(gateway: Gateway, mode: str) -> None:
    async with mcp_client(gateway, mode=mode) as (client, _):
        listed = (await client.list_tools()).tools
    async with mcp_client(gateway, ADMIN_KEY, mode=mode) as (client, _):
        everything = (await client.list_tools()).tools
    tools = registry()
    assert [t.name for t in listed] == ["read_file", "add", "stat"]
    for offered in listed:
        tool = tools.get(offered.name)
        assert tool is not None
        assert (offered.input_schema, offered.description) == (tool.schema, tool.description)
    assert [t.name for t in everything] == tools.names()


async def test_calls_run_through_the_executor_with_spans_metrics_and_retries(gateway: Gateway) -> None:
    wrong = {"file_path": "/etc/hosts"}  # read_file's parameter is `path`
    async with mcp_client(gateway) as (client, seen):
        added = await client.call_tool("add", {"a": 2, "b": 3})
        stat = await client.call_tool("stat", {"path": "/a"})
        rejected = await client.call_tool("read_file", wrong)
        retried = await client.call_tool("read_file", wrong)  # verbatim: the same failing call again
        repaired = await client.call_tool("read_file", {"path": "/etc/hosts"})
    [session] = seen.header("mcp-session-id")

    assert (added.is_error, text(added)) == (False, "5")
    assert (stat.is_error, stat.structured_content, json.loads(text(stat))) == (False, {"path": "/a", "size": 3},
                                                                                 {"path": "/a", "size": 3})
    # The diagnostic is the parse step's own, word for word.
    read_file = registry().get("read_file")
    assert read_file is not None
    diagnostic = await read_file.parse_arguments(json.dumps(wrong), ToolContext("c"))
    assert isinstance(diagnostic, Rejection)
    assert rejected.is_error
    assert retried.is_error
    assert text(rejected) == text(retried) == diagnostic.message
    assert "Unrecognized: file_path (did you mean 'path'?)" in text(rejected)
    assert (repaired.is_error, text(repaired)) == (False, "contents of /etc/hosts")

    spans = calls(gateway)
    assert [(attrs(s)[names.ATTR_TOOL_NAME], attrs(s)[names.ATTR_OUTCOME], attrs(s).get(names.ATTR_REJECTION_REASON),
             attrs(s).get(names.ATTR_RETRY_KIND)) for s in spans] == [
        ("add", "ok", None, None), ("stat", "ok", None, None),
        ("read_file", "rejected", "missing_arguments", None),
        ("read_file", "rejected", "missing_arguments", "verbatim"),
        ("read_file", "ok", None, "corrected")]
    assert {attrs(s)[names.ATTR_CONVERSATION_ID] for s in spans} == {session}  # the session is the trajectory
    assert attrs(spans[2])[names.ATTR_ARGS_SUGGESTIONS] == ("file_path->path",)
    # Each call's span sits under the SERVER span of the HTTP request that carried it.
    servers = {s.context.span_id: s for s in gateway.spans() if s.kind is SpanKind.SERVER}
    for span in spans:
        assert span.parent is not None
        request = servers[span.parent.span_id]
        assert attrs(request)[names.ATTR_HTTP_ROUTE] == "/mcp"
        assert attrs(request)[names.ATTR_CONVERSATION_ID] == session

    metric = gateway.metric
    assert metric(names.METRIC_TOOL_CALLS, tool="add", outcome="ok") == 1
    assert metric(names.METRIC_TOOL_CALLS, tool="stat", outcome="ok") == 1
    assert metric(names.METRIC_TOOL_CALLS, tool="read_file", outcome="rejected") == 2
    assert metric(names.METRIC_TOOL_CALLS, tool="read_file", outcome="ok") == 1
    assert metric(names.METRIC_TOOL_REJECTIONS, tool="read_file", reason="missing_arguments") == 2
    assert metric(names.METRIC_TOOL_RETRIES, tool="read_file", kind="verbatim") == 1
    assert metric(names.METRIC_TOOL_RETRIES, tool="read_file", kind="corrected") == 1
    # Every HTTP request to /mcp is a request like any other: initialize and the rest, counted.
    assert metric(names.METRIC_REQUESTS, route="/mcp", status="200") >= 5


async def test_tool_errors_are_error_results(gateway: Gateway) -> None:
    async with mcp_client(gateway, ADMIN_KEY) as (client, _):
        locked = await client.call_tool("locked", {})
        crashed = await client.call_tool("crash", {})
        strict = await client.call_tool("strict", {"path": "relative"})
    assert (locked.is_error, text(locked)) == (True, "the file is locked")
    assert (crashed.is_error, text(crashed)) == (True, "ERROR: (ValueError) disk on fire")
    assert (strict.is_error, text(strict)) == (True, "path must be absolute")
    assert [(attrs(s)[names.ATTR_OUTCOME], attrs(s).get(names.ATTR_REJECTION_REASON)) for s in calls(gateway)] == [
        ("error", None), ("error", None), ("rejected", "parser")]


async def test_a_tool_the_caller_has_not_is_a_protocol_error(gateway: Gateway) -> None:
    async with mcp_client(gateway) as (client, _):
        with pytest.raises(MCPError) as outside:
            await client.call_tool("admin", {})
        with pytest.raises(MCPError) as unknown:
            await client.call_tool("reed_file", {"path": "/a"})
        assert [t.name for t in (await client.list_tools()).tools] == ["read_file", "add", "stat"]
    assert outside.value.error.code == unknown.value.error.code == INVALID_PARAMS
    assert outside.value.error.message == ("Tool 'admin' is not available to this caller. "
                                           "Available tools: read_file, add, stat.")
    assert "Did you mean 'read_file'?" in unknown.value.error.message
    assert [(attrs(s)[names.ATTR_TOOL_NAME], attrs(s)[names.ATTR_REJECTION_REASON]) for s in calls(gateway)] == [
        ("admin", "not_allowed"), ("reed_file", "unknown_tool")]
    assert gateway.metric(names.METRIC_TOOL_REJECTIONS, tool="admin", reason="not_allowed") == 1
    assert gateway.metric(names.METRIC_TOOL_REJECTIONS, tool=names.UNKNOWN_TOOL, reason="unknown_tool") == 1


async def test_without_a_session_the_trajectory_header_groups_calls(gateway: Gateway) -> None:
    """The 2026-07-28 revision has no session: each request is its own trajectory, unless the
    client names one in X-Trajectory-Id (which also wins over a session)."""
    wrong = {"file_path": "/a"}
    async with mcp_client(gateway, mode=STATELESS) as (client, seen):
        await client.call_tool("read_file", wrong)
        await client.call_tool("read_file", wrong)
    assert not seen.header("mcp-session-id")
    async with mcp_client(gateway, mode=STATELESS, **{"X-Trajectory-Id": "run-42"}) as (client, _):
        await client.call_tool("read_file", wrong)
        await client.call_tool("read_file", wrong)
    async with mcp_client(gateway, mode=LEGACY, **{"X-Trajectory-Id": "run-43"}) as (client, _):
        await client.call_tool("read_file", wrong)
    spans = calls(gateway)
    assert [attrs(s).get(names.ATTR_RETRY_KIND) for s in spans] == [None, None, None, "verbatim", None]
    assert [attrs(s)[names.ATTR_CONVERSATION_ID] for s in spans[2:]] == ["run-42", "run-42", "run-43"]
    assert attrs(spans[0])[names.ATTR_CONVERSATION_ID] != attrs(spans[1])[names.ATTR_CONVERSATION_ID]


@pytest.mark.parametrize("authorization", [None, "Bearer sk-not-a-key", f"Basic {READER_KEY}"],
                         ids=["none", "wrong", "not-bearer"])
async def test_a_request_without_a_gateway_key_is_refused(gateway: Gateway, authorization: str | None) -> None:
    headers = {**MCP_HEADERS, **({"Authorization": authorization} if authorization else {})}
    response = await gateway.http.post("/mcp", json=INITIALIZE, headers=headers)
    assert response.status == 401
    assert (await response.json())["error"]["type"] == "authentication_error"
    assert not calls(gateway)


async def test_a_session_answers_only_the_key_that_opened_it(gateway: Gateway) -> None:
    opened = await gateway.http.post("/mcp", json=INITIALIZE,
                                     headers={**MCP_HEADERS, "Authorization": f"Bearer {READER_KEY}"})
    assert opened.status == 200
    session = opened.headers["Mcp-Session-Id"]
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    other = await gateway.http.post("/mcp", json=listing, headers={
        **MCP_HEADERS, "Authorization": f"Bearer {ADMIN_KEY}", "Mcp-Session-Id": session,
        "Mcp-Protocol-Version": "2025-06-18"})
    assert other.status == 404


async def test_without_keys_the_endpoint_is_open(make_gateway: GatewayFactory) -> None:
    gateway = await make_gateway(Settings(port=0, upstream="http://127.0.0.1:9/v1"), registry())
    async with mcp_client(gateway, key=None) as (client, _):
        assert [t.name for t in (await client.list_tools()).tools] == registry().names()
        assert text(await client.call_tool("add", {"a": 1, "b": 1})) == "2"


@pytest.mark.parametrize(("method", "body", "headers"), [
    ("POST", b"{not json", MCP_HEADERS),
    ("POST", b'{"jsonrpc": "2.0", "id": 1}', MCP_HEADERS),
    ("POST", b"[1, 2]", MCP_HEADERS),
    ("POST", json.dumps(INITIALIZE).encode(), {**MCP_HEADERS, "Content-Type": "text/plain"}),
    ("POST", json.dumps(INITIALIZE).encode(), {"Content-Type": "application/json", "Accept": "text/html"}),
    ("GET", b"", {"Accept": "text/event-stream"}),
    ("GET", b"", {"Accept": "text/event-stream", "Mcp-Session-Id": "no-such-session"}),
    ("DELETE", b"", {}),
    ("PUT", b"{}", MCP_HEADERS),
    ("POST", json.dumps(INITIALIZE).encode(), {**MCP_HEADERS, "Origin": "http://rebound.example"}),
], ids=["bad-json", "no-method", "not-an-object", "content-type", "accept", "get-no-session", "get-unknown-session",
        "delete-no-session", "put", "foreign-origin"])
async def test_bad_requests_are_refused_without_a_server_error(
        gateway: Gateway, method: str, body: bytes, headers: dict[str, str]) -> None:
    response = await gateway.http.request(method, "/mcp", data=body,
                                          headers={**headers, "Authorization": f"Bearer {READER_KEY}"})
    answer = await response.text()
    assert 400 <= response.status < 500, (response.status, answer)
    assert "Traceback" not in answer
    # A method /mcp does not take is the router's 405, before any route matched.
    route = "unmatched" if method == "PUT" else "/mcp"
    assert gateway.metric(names.METRIC_REQUESTS, route=route, status=str(response.status)) == 1


async def test_the_agents_sdk_lists_and_calls_through_mcp(gateway: Gateway) -> None:
    params: MCPServerStreamableHttpParams = {"url": f"{gateway.url}/mcp",
                                             "headers": {"Authorization": f"Bearer {READER_KEY}"}}
    server = MCPServerStreamableHttp(params, use_structured_content=True)
    async with server:
        listed = [tool.name for tool in await server.list_tools()]
        result = await server.call_tool("add", {"a": 20, "b": 22})
    assert listed == ["read_file", "add", "stat"]
    assert (result.is_error, text(result)) == (False, "42")
    assert [(attrs(s)[names.ATTR_TOOL_NAME], attrs(s)[names.ATTR_OUTCOME]) for s in calls(gateway)] == [("add", "ok")]


async def test_event_streams_end_when_the_gateway_shuts_down() -> None:
    """A client's open GET stream does not hold the shutdown for its grace period."""
    settings = Settings(port=0, upstream="http://127.0.0.1:9/v1", shutdown_grace_seconds=30)
    async with aiohttp.ClientSession() as http, AsyncExitStack() as running:
        url, _, _ = await running.enter_async_context(serve_gateway(settings, registry()))
        opened = await http.post(f"{url}/mcp", json=INITIALIZE, headers=MCP_HEADERS)
        session = {"Mcp-Session-Id": opened.headers["Mcp-Session-Id"], "Mcp-Protocol-Version": "2025-06-18"}
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert (await http.post(f"{url}/mcp", json=initialized, headers={**MCP_HEADERS, **session})).status == 202
        stream = await http.get(f"{url}/mcp", headers={"Accept": "text/event-stream", **session})
        assert (stream.status, stream.content_type) == (200, "text/event-stream")
        started = time.monotonic()
        await running.aclose()
        assert time.monotonic() - started < 5
        assert await stream.read() == b""  # ended, not cut
