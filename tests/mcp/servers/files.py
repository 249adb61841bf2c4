"""A small MCP server for the tests, written with the `mcp` package. Every call it receives is
written as a JSON line to the file named by $RECORD (its tool, arguments and `_meta`), and so is its
process id when it starts. `python files.py` serves over stdio; `python files.py http [PORT]`
serves streamable HTTP on 127.0.0.1 (at /mcp), and `python files.py sse [PORT]` the legacy SSE
transport (at /sse), writing its port to stdout once it listens."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import sys
from typing import Any

import anyio
import mcp_types
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("files")
PIXEL = bytes.fromhex("89504e470d0a1a0a")  # a PNG signature: enough to be an image's bytes


def record(entry: dict[str, Any]) -> None:
    path = os.environ.get("RECORD")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(entry) + "\n")


def received(tool: str, args: dict[str, Any], ctx: Context) -> None:
    meta = ctx.request_context.meta
    record({"tool": tool, "args": args, "meta": dict(meta) if meta else {}})


@server.tool()
def read_file(path: str, ctx: Context, offset: int = 0) -> str:
    """Read a file."""
    received("read_file", {"path": path, "offset": offset}, ctx)
    return f"contents of {path} from {offset}"


@server.tool()
def fail(ctx: Context) -> str:
    """Always fails."""
    received("fail", {}, ctx)
    raise ToolError("the disk is full")


@server.tool()
async def hang(ctx: Context) -> str:
    """Never answers."""
    received("hang", {}, ctx)
    await asyncio.Event().wait()
    return "never"


@server.tool()
def stats(ctx: Context) -> dict[str, int]:
    """Structured content."""
    received("stats", {}, ctx)
    return {"files": 3, "bytes": 120}


@server.tool(structured_output=False)
def picture(ctx: Context) -> list[mcp_types.ContentBlock]:
    """Text and an image."""
    received("picture", {}, ctx)
    return [mcp_types.TextContent(type="text", text="a pixel:"),
            mcp_types.ImageContent(type="image", data=base64.b64encode(PIXEL).decode(), mime_type="image/png")]


@server.tool()
async def grow(ctx: Context) -> str:
    """Adds a tool named `fresh`, and says the list of tools changed."""
    received("grow", {}, ctx)
    server.add_tool(lambda: "fresh result", name="fresh", description="Added while serving")
    await ctx.notify_tools_changed()  # 2026-07-28 clients, on their listen stream
    if not ctx.request_context.protocol_version.startswith("2026"):
        await ctx.request_context.session.send_tool_list_changed()  # earlier clients
    return "grown"


def serve_http(transport: str, port: int) -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen()
    # Connections made from now on wait in the backlog until the app is up: whoever reads this
    # line can connect at once, with no need to poll.
    print(listener.getsockname()[1], flush=True)
    app = server.sse_app() if transport == "sse" else server.streamable_http_app()
    config = uvicorn.Config(app, log_level="warning")
    anyio.run(uvicorn.Server(config).serve, [listener])


if __name__ == "__main__":
    record({"pid": os.getpid()})
    if sys.argv[1:2] in (["http"], ["sse"]):
        serve_http(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    else:
        server.run()
