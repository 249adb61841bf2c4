"""/mcp: the tool registry for MCP clients (streamable HTTP), served by gateway.mcp.server.

The app's middleware authenticates the request as it does a /v1 one (a gateway key, when keys
are configured) and gives it its request span. Here the request finds its trajectory: the
X-Trajectory-Id header when the client sends one, else its MCP session (the Mcp-Session-Id of
the 2025 protocol revisions), else, as with any request that names none, one of its own.
"""

from __future__ import annotations

from dataclasses import replace

from aiohttp import web

from gateway.caller import Caller
from gateway.http.asgi import serve_asgi
from gateway.http.bodies import EXPECT, read_body, require_json
from gateway.http.keys import CALLER, EXECUTOR, MCP_ENDPOINT, REGISTRY, SETTINGS
from gateway.mcp.server import McpEndpoint
from gateway.routes.render import reported
from gateway.wire.headers import is_trajectory_id

PATH = "/mcp"
SESSION_HEADER = "Mcp-Session-Id"


def _trajectory(caller: Caller, session_id: str | None) -> Caller:
    if caller.trajectory_named or not is_trajectory_id(session_id):
        return caller
    return replace(caller, trajectory_id=str(session_id))


async def serve(request: web.Request) -> web.StreamResponse:
    endpoint = request.app[MCP_ENDPOINT]
    caller = request[CALLER] = _trajectory(request[CALLER], request.headers.get(SESSION_HEADER))
    # An event stream (GET) ends when the gateway shuts down; calls under way run to their end.
    closing = endpoint.closing if request.method == "GET" else None
    if request.method == "POST":  # the transport takes application/json only: the SDK's rule, in our answer
        require_json(request, structured_suffix=False)
    body = await read_body(request)  # held to the gateway's limits
    response = await serve_asgi(endpoint.handle, request, body, endpoint.scope_of(caller), closing=closing)
    return reported(response, caller)


def mount(app: web.Application) -> None:
    """Serve the MCP endpoint on `app` (its registry and executor set already)."""
    endpoint = app[MCP_ENDPOINT] = McpEndpoint(app[REGISTRY], app[EXECUTOR], app[SETTINGS])
    app.cleanup_ctx.append(endpoint.lifetime)
    # First of the shutdown handlers: the one that waits for requests under way to end would
    # otherwise wait its whole grace period for event streams that never end by themselves.
    app.on_shutdown.insert(0, endpoint.close_streams)
    # The transport's three methods; not HEAD: the SDK would answer it with a body.
    app.router.add_get(PATH, serve, allow_head=False, **EXPECT)
    app.router.add_post(PATH, serve, **EXPECT)
    app.router.add_delete(PATH, serve, **EXPECT)
