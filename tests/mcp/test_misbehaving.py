"""MCP servers that misbehave (tests/mcp/servers/odd.py), and odd requests to /mcp: none of it is
a 500, a flapping connection, a frozen event loop or a leaked secret."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from gateway.demo.model import Reply
from gateway.settings.model import Settings
from telemetry import names
from tests.conftest import GatewayFactory, StackFactory, tool_messages
from tests.mcp.conftest import connection

pytestmark = pytest.mark.slow  # MCP servers as processes

ODD_SERVER = {"command": sys.executable, "args": [str(Path(__file__).parent / "servers" / "odd.py")],
              "ping_interval_seconds": 0}


async def test_a_line_on_stdout_that_is_not_mcp_is_ignored(make_stack: StackFactory) -> None:
    stack = await make_stack(mcp_servers={"odd": {**ODD_SERVER, "args": [*ODD_SERVER["args"], "banner"]}})
    source = connection(stack, "odd")
    async with stack.http.post("/v1/tools/odd__echo/invoke", json={"arguments": {"text": "hi"}}) as response:
        assert (await response.json())["content"] == "echo: [('text', 'hi')]"
    assert (source.state, source.disconnects) == ("up", 0)  # not a lost connection, nor a restarted server


async def test_a_name_listed_twice_counts_once(make_stack: StackFactory) -> None:
    stack = await make_stack(mcp_servers={"odd": ODD_SERVER})
    assert connection(stack, "odd").tools == ("odd__echo", "odd__count", "odd__match")
    async with stack.http.get("/readyz") as response:
        [odd] = (await response.json())["mcp_servers"]
    assert odd["tools"] == 3


async def test_a_result_that_breaks_its_output_schema_is_that_calls_error(make_stack: StackFactory) -> None:
    """An answer the client refuses is that call's error, not a lost connection: the next call of
    the turn runs, and the server is not restarted."""
    stack = await make_stack(mcp_servers={"odd": ODD_SERVER})
    source = connection(stack, "odd")
    stack.script.then(Reply(tool_calls=[("odd__count", {}), ("odd__echo", {"text": "hi"})]), Reply(content="ok"))
    await stack.ask(False, messages=[{"role": "user", "content": "count"}])
    counted, echoed = tool_messages(stack.upstream_requests[1])
    assert counted["content"].startswith("MCP server 'odd' answered the call of its tool 'count' with a result "
                                         "that could not be read")
    assert echoed["content"] == "echo: [('text', 'hi')]"
    assert (source.state, source.disconnects) == ("up", 0)
    assert stack.metric(names.METRIC_MCP_SERVER_DISCONNECTS, server="odd") == 0


async def test_a_hostile_pattern_and_a_dangling_ref_are_left_to_the_server(make_stack: StackFactory) -> None:
    """A server's `pattern` is not run by Python's backtracking engine on the model's text (this
    one would take seconds on these 23 characters, and minutes on 40), and a `$ref` that leads
    nowhere does not fail the call: the names and types are checked here, the rest by the server."""
    stack = await make_stack(mcp_servers={"odd": ODD_SERVER})
    word = "a" * 22 + "!"
    stack.script.then(Reply(tool_calls=[("odd__match", {"word": word, "thing": 1})]), Reply(content="ok"))
    await asyncio.wait_for(stack.ask(False, messages=[{"role": "user", "content": "match"}]), 30)
    [message] = tool_messages(stack.upstream_requests[1])
    assert message["content"] == f"match: [('thing', 1), ('word', '{word}')]"


@pytest.mark.parametrize("transport", ["streamable_http", "sse"])
async def test_a_server_url_with_a_key_in_it_stays_out_of_readyz(make_stack: StackFactory,
                                                                  aiohttp_server: AiohttpServer,
                                                                  transport: str) -> None:
    async def refuse(request: web.Request) -> web.Response:
        return web.Response(status=401, text="who are you?")

    refusing = web.Application()
    refusing.router.add_route("*", "/{path:.*}", refuse)
    server = await aiohttp_server(refusing)
    url = str(server.make_url("/mcp?token=sk-secret-in-the-url"))
    stack = await make_stack(mcp_servers={"remote": {"url": url, "transport": transport, "connect_timeout_seconds": 5,
                                                     "ping_interval_seconds": 0}})
    await connection(stack, "remote").wait_until(lambda c: c.state == "down")
    async with stack.http.get("/readyz") as response:
        text = await response.text()
    assert '"state": "down"' in text
    assert "sk-secret-in-the-url" not in text


async def test_a_stalled_body_on_mcp_is_a_408(make_gateway: GatewayFactory) -> None:
    gateway = await make_gateway(Settings(port=0, upstream="http://127.0.0.1:9/v1", body_read_timeout_seconds=0.2))
    reads, writes = await asyncio.open_connection(gateway.http.server.host, gateway.http.server.port)
    writes.write(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Accept: application/json, text/event-stream\r\nContent-Length: 100\r\n\r\n{\"jsonrpc\"")
    await writes.drain()
    head = await asyncio.wait_for(reads.readuntil(b"\r\n\r\n"), 30)
    writes.close()
    assert head.startswith(b"HTTP/1.1 408 ")


async def test_head_is_not_a_method_of_mcp(make_gateway: GatewayFactory) -> None:
    """aiohttp would answer HEAD through the GET route, and the SDK with a body, which desyncs a
    kept-alive connection: HEAD is refused like any method the transport does not take."""
    gateway = await make_gateway(Settings(port=0, upstream="http://127.0.0.1:9/v1"))
    async with gateway.http.head("/mcp") as response:
        assert response.status == 405
        assert "HEAD" not in response.headers["Allow"]
    async with gateway.http.get("/healthz") as response:  # the same connection still reads right
        assert (await response.json()) == {"status": "ok"}
