"""Liveness, readiness and the metrics exposition."""

from __future__ import annotations

import asyncio
import hmac

from aiohttp import web

from gateway.errors import Unauthorized
from gateway.http.keys import ENGINE, MCP_SOURCES, METRICS_PAGE, RESPONSES_MCP_SOURCES, SETTINGS, STATE, UPSTREAMS


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Ready once the engine is built and the provider answers on the route the engine uses (its
    proxy and TLS; a gateway that cannot reach its provider should not get traffic; `reason` says
    why not). With several upstreams, it is ready while any upstream of the default route is reachable
    (with no default, any upstream), and `upstreams` says which of those are. With MCP servers
    configured, `mcp_servers` lists each one's state (`responses_mcp_servers` those of the servers
    Responses requests may declare); only a server marked `required` that is not up
    makes the gateway unready: the others' tools answer that their server is unavailable, and the
    rest of the gateway works. With a shared state store (Redis), `state_store` is "up" or
    "unavailable"; while it is unavailable the status is "degraded", still 200: every replica shares
    that store, and the requests that do not continue a held turn work (those that do get a 503 with
    retry-after)."""
    sources, declarable = request.app[MCP_SOURCES], request.app[RESPONSES_MCP_SOURCES]
    servers: dict[str, object] = {"mcp_servers": sources.status()} if sources.connections else {}
    if declarable.connections:
        servers["responses_mcp_servers"] = declarable.status()
    state = await request.app[STATE].status()
    if state is not None:
        servers["state_store"] = state
    if ENGINE not in request.app:
        return web.json_response({"status": "starting", **servers}, status=503)
    upstreams = request.app[UPSTREAMS]
    needed = upstreams.ready_with()  # ready while any of these is reachable; the others are not waited on
    reasons = dict(zip(needed, await asyncio.gather(*(upstreams.clients[name].reach() for name in needed)),
                       strict=True))
    if len(upstreams.clients) > 1:  # each one's reachability, worded as a provider call's 502 would be
        servers["upstreams"] = {name: reason or "reachable" for name, reason in reasons.items()}
    if all(reason is not None for reason in reasons.values()):
        reason = reasons[needed[0]] if len(needed) == 1 else "no upstream of the default route is reachable"
        return web.json_response({"status": "provider_unreachable", "reason": reason, **servers}, status=503)
    if sources.required_down() or declarable.required_down():
        return web.json_response({"status": "mcp_server_unavailable", **servers}, status=503)
    return web.json_response({"status": "degraded" if state == "unavailable" else "ready", **servers})


def _check_scraper(request: web.Request) -> None:
    """With a `metrics_key` set, only a scraper that sends it as a bearer token reads the metrics
    (model names, tool names and traffic are the operator's business, not every key holder's)."""
    key = request.app[SETTINGS].metrics_key
    if key is None:
        return
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    sent = token.strip().encode() if scheme.lower() == "bearer" else b""
    if not (sent and hmac.compare_digest(sent, key.get_secret_value().encode())):
        raise Unauthorized("the metrics need the gateway's metrics key: send Authorization: Bearer <metrics_key>",
                           code="invalid_api_key", headers={"WWW-Authenticate": 'Bearer realm="metrics"'})


async def metrics(request: web.Request) -> web.Response:
    _check_scraper(request)
    body, content_type = await request.app[METRICS_PAGE](request.headers.get("Accept"))
    response = web.Response(body=body)
    response.headers["Content-Type"] = content_type
    return response
