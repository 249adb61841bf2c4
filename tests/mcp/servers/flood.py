"""An MCP server, written with the `mcp` package, whose answers can be as large as a test asks:
`big` returns `size` characters, and `flood` writes `size` bytes that are not MCP and have no
newline onto stdout, straight before its answer (over stdio, the two then make one line). Each
call's tool name goes as a JSON line to the file named by $RECORD, and so does the process id at
start. `python flood.py` serves over stdio; `python flood.py http json|sse [PORT]` serves
streamable HTTP on 127.0.0.1 (at /mcp) with JSON or SSE answers, writing its port once it listens."""

from __future__ import annotations

import json
import os
import socket
import sys

import anyio
import mcp_types
import uvicorn
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("flood")
# The SDK's stdio server moves its wire off fd 1 (a stray print then goes to stderr): a copy made
# first still reaches the client, as a server's own misbehaving writer would.
WIRE = os.dup(1)


def record(entry: dict[str, object]) -> None:
    path = os.environ.get("RECORD")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(entry) + "\n")


@server.tool(structured_output=False)  # the text once, not again as structured content
async def big(size: int, ctx: Context) -> str:
    """Returns `size` characters."""
    record({"tool": "big"})
    # A notification first: over streamable HTTP, it makes the answer an SSE stream (unless the
    # server answers JSON only), where a quick answer alone would be a JSON body.
    await ctx.session.send_notification(mcp_types.ResourceListChangedNotification(), related_request_id=ctx.request_id)
    return "y" * size


@server.tool()
def flood(size: int) -> str:
    """Writes `size` bytes with no newline to stdout, then answers."""
    record({"tool": "flood"})
    garbage = memoryview(b"x" * size)
    while garbage:
        garbage = garbage[os.write(WIRE, garbage):]
    return "flooded"


@server.tool()
def echo(text: str) -> str:
    """Says `text` back."""
    record({"tool": "echo"})
    return text


def serve_http(json_response: bool, port: int) -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen()
    print(listener.getsockname()[1], flush=True)  # connections wait in the backlog until the app is up
    app = server.streamable_http_app(json_response=json_response)
    anyio.run(uvicorn.Server(uvicorn.Config(app, log_level="warning")).serve, [listener])


if __name__ == "__main__":
    record({"pid": os.getpid()})
    if sys.argv[1:2] == ["http"]:
        serve_http(sys.argv[2] == "json", int(sys.argv[3]) if len(sys.argv) > 3 else 0)
    else:
        server.run()
