"""An MCP server, written with the `mcp` package's low-level server, that is hard on the client
listing its tools.

`python hostile.py badschema` lists `echo` beside tools whose `inputSchema` no client can use: one
whose root is not an object, one whose `properties` is a list, and one without a name. The SDK's
server would refuse to send those, so they are put into the `tools/list` answer on its way out
(past the SDK's check), as a server written without it would send them.
`python hostile.py churn N INTERVAL` lists N tools (`t0` ... `t{N-1}`, and `echo`) and announces
`tools/list_changed` every INTERVAL seconds, for ever; each announcement changes the description of
`t0` (the others stay as they were). Append `http` to serve streamable HTTP on 127.0.0.1 (at /mcp)
instead of stdio; its port is the first line written. Each `tools/list` it answers goes as a JSON
line to the file named by $RECORD, and so does the process id at start."""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any

import anyio
import mcp_types as types
import uvicorn
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp.shared.message import SessionMessage
from mcp_types.jsonrpc import JSONRPCResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

ECHO = {"name": "echo", "description": "Echo",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}
BAD = [
    {"name": "scalar", "description": "Its root is a string", "inputSchema": {"type": "string"}},
    {"name": "listed", "description": "Its properties are a list",
     "inputSchema": {"type": "object", "properties": ["a", "b"]}},
    {"description": "It has no name", "inputSchema": {"type": "object"}},
]


def record(entry: dict[str, object]) -> None:
    path = os.environ.get("RECORD")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(entry) + "\n")


def churn_tools(count: int, generation: int) -> list[dict[str, Any]]:
    tools = [{"name": f"t{i}", "description": f"Tool {i}" + (f", version {generation}" if i == 0 else ""),
              "inputSchema": {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
                              "required": ["a"]}} for i in range(count)]
    return [ECHO, *tools]


class Hostile:
    def __init__(self, mode: str, count: int, interval: float) -> None:
        self.mode, self.count, self.interval = mode, count, interval
        self.generation = 0
        self.bus = InMemorySubscriptionBus()

    async def list_tools(self, ctx: ServerRequestContext[Any, Any],
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        record({"listed": self.generation})
        raw = [ECHO] if self.mode == "badschema" else churn_tools(self.count, self.generation)
        return types.ListToolsResult.model_validate({"tools": raw})

    async def call_tool(self, ctx: ServerRequestContext[Any, Any],
                        params: types.CallToolRequestParams) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(text=f"{params.name}: {params.arguments}")])

    async def announce(self) -> None:
        while True:
            await anyio.sleep(self.interval)
            self.generation += 1
            await self.bus.publish(ToolsListChanged())

    def server(self) -> Server[Any]:
        return Server("hostile", on_list_tools=self.list_tools, on_call_tool=self.call_tool,
                      on_subscriptions_listen=ListenHandler(self.bus))


def spoiled(result: dict[str, Any]) -> dict[str, Any]:
    """A `tools/list` result with the unusable tools added (any other result as it is)."""
    return {**result, "tools": [*result["tools"], *BAD]} if isinstance(result.get("tools"), list) else result


async def spoil_stdio(outgoing: MemoryObjectReceiveStream[SessionMessage],
                      wire: MemoryObjectSendStream[SessionMessage]) -> None:
    async with outgoing, wire:
        async for item in outgoing:
            message = item.message
            if isinstance(message, JSONRPCResponse):
                item = SessionMessage(message.model_copy(update={"result": spoiled(message.result)}))
            await wire.send(item)


def spoil_http(app: ASGIApp) -> ASGIApp:
    """The app, with its JSON answers' `tools/list` results spoiled."""
    async def spoiling(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)
        started: list[Message] = []
        body = b""

        async def hold(message: Message) -> None:
            nonlocal body
            if message["type"] == "http.response.start":
                started.append(message)
                if not dict(message["headers"]).get(b"content-type", b"").startswith(b"application/json"):
                    await send(message)  # a stream (the listen stream, say) goes as it is
                return
            if not dict(started[0]["headers"]).get(b"content-type", b"").startswith(b"application/json"):
                return await send(message)
            body += message.get("body", b"")
            if message.get("more_body"):
                return
            start = started[0]
            if body:
                answer = json.loads(body)
                if isinstance(answer.get("result"), dict):
                    answer["result"] = spoiled(answer["result"])
                body = json.dumps(answer).encode()
            headers = [(k, v) for k, v in start["headers"] if k != b"content-length"]
            await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
        await app(scope, receive, hold)
    return spoiling


async def serve_stdio(hostile: Hostile) -> None:
    server = hostile.server()
    options = server.create_initialization_options(NotificationOptions(tools_changed=True))
    async with anyio.create_task_group() as group, stdio_server() as (reads, writes):
        if hostile.mode == "churn":
            group.start_soon(hostile.announce)
            await server.run(reads, writes, options)
        else:
            outgoing, taken = anyio.create_memory_object_stream[SessionMessage](0)
            group.start_soon(spoil_stdio, taken, writes)
            await server.run(reads, outgoing, options)
        group.cancel_scope.cancel()


async def serve_http(hostile: Hostile) -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    print(listener.getsockname()[1], flush=True)  # connections wait in the backlog until the app is up
    server = hostile.server()
    app: ASGIApp = server.streamable_http_app()
    if hostile.mode == "badschema":
        app = spoil_http(server.streamable_http_app(json_response=True))
    async with anyio.create_task_group() as group:
        if hostile.mode == "churn":
            group.start_soon(hostile.announce)
        await uvicorn.Server(uvicorn.Config(app, log_level="warning")).serve([listener])
        group.cancel_scope.cancel()


if __name__ == "__main__":
    record({"pid": os.getpid()})
    mode = sys.argv[1]
    numbers = [arg for arg in sys.argv[2:] if arg != "http"]
    hostile = Hostile(mode, int(numbers[0]) if numbers else 0, float(numbers[1]) if len(numbers) > 1 else 0.5)
    anyio.run(serve_http if "http" in sys.argv else serve_stdio, hostile)
