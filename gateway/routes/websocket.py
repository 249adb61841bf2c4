"""A WebSocket upgrade on the Responses routes (the Responses API's WebSocket mode, which the Codex
CLI tries first) is answered at once with a 426: the gateway runs its tool loop over HTTP only.
The Codex CLI takes a 426 as "this server has no WebSocket mode" and goes on over HTTP at once;
any other refusal (the provider's 404, had the pass-through sent the upgrade on without its
Upgrade header) it retries, with backoff, several times first. Without an upgrade, a GET there
is the pass-through's, as before."""

from __future__ import annotations

from aiohttp import web

from gateway.errors import BadRequest
from gateway.routes import passthrough

PATHS = ("/v1/responses", "/openai/v1/responses", "/openai/responses")


def wants_websocket(request: web.Request) -> bool:
    """The request asks to switch to the WebSocket protocol (RFC 6455's opening handshake)."""
    return any(part.strip().lower() == "websocket" for part in request.headers.get("Upgrade", "").split(","))


async def responses_get(request: web.Request) -> web.StreamResponse:
    """GET on a Responses route: a 426 for a WebSocket upgrade, else the pass-through."""
    if wants_websocket(request):
        raise BadRequest("this gateway serves the Responses API over HTTP only, not over a WebSocket: send "
                         "POST /v1/responses (streamed with stream: true)", status=426,
                         code="websocket_not_supported")
    return await passthrough.passthrough(request)
