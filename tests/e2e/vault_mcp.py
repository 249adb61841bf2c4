"""An MCP server, written with the `mcp` package, whose tool answers with an AWS access key id: what
the `secrets` guardrail on its entry in mcp_servers must mask before a provider reads it.
`python vault_mcp.py` serves over stdio; `python vault_mcp.py http` serves streamable HTTP on
127.0.0.1 (at /mcp), writing its port to stdout once it listens."""

from __future__ import annotations

import socket
import sys

import anyio
import uvicorn
from mcp.server.mcpserver import MCPServer

AWS_KEY = "AKIA" + "Q7RZ2M4XW9KD3HPL"  # tests.e2e.guards.AWS_KEY (this script runs outside the tests package)

server = MCPServer("vault")


@server.tool()
def credentials(account: str) -> str:
    """The credentials of an account."""
    return f"account {account}: aws_access_key_id = {AWS_KEY}, region = eu-west-1"


def serve_http() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    print(listener.getsockname()[1], flush=True)  # connections wait in the backlog until the app is up
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning")
    anyio.run(uvicorn.Server(config).serve, [listener])


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        serve_http()
    else:
        server.run()
