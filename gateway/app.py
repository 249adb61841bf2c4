"""create_app: the aiohttp application, its middleware and its routes."""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler

from gateway.errors import GatewayError, error_response, from_http_exception, internal_error
from gateway.instrumentation import Instrumentation, RequestInfo
from gateway.keys import (
    EXECUTOR,
    INSTRUMENTATION,
    LOOP,
    PENDING,
    REGISTRY,
    SCOPE,
    SETTINGS,
    UPSTREAM,
    RequestScope,
    is_trajectory_id,
)
from gateway.loop import ToolLoop
from gateway.routes import chat, health, passthrough, tools
from gateway.routes.common import authenticate
from gateway.settings import Settings
from gateway.tools import ToolExecutor, ToolRegistry
from gateway.turns import PendingTurns
from gateway.upstream import Upstream

log = logging.getLogger("toolspan")

TRAJECTORY_HEADER = "X-Trajectory-Id"
TRACE_HEADER = "X-Trace-Id"
def _route_of(request: web.Request) -> str:
    """The matched route pattern: a bounded label, unlike the path."""
    route = request.match_info.route
    resource = route.resource if route is not None else None
    return resource.canonical if resource is not None else "unmatched"


def _trajectory_of(request: web.Request) -> str | None:
    sent = request.headers.get(TRAJECTORY_HEADER)
    return sent if is_trajectory_id(sent) else None


@web.middleware
async def observe(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The request span around everything, and the one place errors become responses."""
    instrumentation = request.app[INSTRUMENTATION]
    sent = _trajectory_of(request)
    fresh = secrets.token_hex(24)  # a trajectory id, should the caller name none, and a request id
    trajectory = sent or fresh[:32]
    info = RequestInfo(request.method, _route_of(request), request.path, request.headers, trajectory)
    with instrumentation.request(info) as trace:
        found = RequestScope(trajectory, fresh[32:], trace, trajectory_sent=sent is not None)
        request[SCOPE] = found
        error: GatewayError | None = None
        try:
            if request.path.startswith("/v1/"):
                found.credentials = authenticate(request)  # before any body is read
            response = await handler(request)
        except GatewayError as exc:
            error = exc
        except web.HTTPException as exc:
            error = from_http_exception(exc)
        except Exception:
            log.exception("unhandled error on %s %s", request.method, request.path)
            error = internal_error()
        if error is not None:
            response = error_response(error)
            found.error_type = error.type
        trace.finish(response.status, found.error_type)
        return response


async def _stamp(request: web.Request, response: web.StreamResponse) -> None:
    """Every response names its trajectory and trace, streamed ones included."""
    found = request.get(SCOPE)
    if isinstance(found, RequestScope):
        response.headers[TRAJECTORY_HEADER] = found.trajectory_id
        response.headers[TRACE_HEADER] = found.trace.trace_id


async def _upstream(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    assert settings.upstream is not None  # checked in create_app
    session = aiohttp.ClientSession(auto_decompress=False, connector=aiohttp.TCPConnector(limit=0))
    upstream = Upstream(session, settings.upstream, settings.upstream_api_key, settings.upstream_timeout_seconds,
                        settings.upstream_connect_timeout_seconds)
    app[UPSTREAM] = upstream
    app[LOOP] = ToolLoop(upstream, app[EXECUTOR], app[REGISTRY], app[INSTRUMENTATION], app[PENDING],
                         settings.max_rounds, settings.keepalive_seconds)
    yield
    await session.close()


def create_app(settings: Settings, registry: ToolRegistry, instrumentation: Instrumentation) -> web.Application:
    if not settings.upstream:
        raise ValueError("settings.upstream is not set: give a provider URL or start the built-in model")
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[observe])
    app[SETTINGS] = settings
    app[REGISTRY] = registry
    app[INSTRUMENTATION] = instrumentation
    app[EXECUTOR] = ToolExecutor(registry, instrumentation, settings.tool_timeout_seconds)
    app[PENDING] = PendingTurns(settings.pending_turn_capacity, settings.pending_turn_ttl_seconds)
    app.cleanup_ctx.append(_upstream)
    app.on_response_prepare.append(_stamp)
    app.router.add_post("/v1/chat/completions", chat.chat_completions)
    app.router.add_get("/v1/tools", tools.list_tools)
    app.router.add_post("/v1/tools/{name}/invoke", tools.invoke)
    app.router.add_post("/v1/tools/{name}/parse", tools.parse)
    app.router.add_route("*", "/v1/{tail:.*}", passthrough.passthrough)
    app.router.add_get("/metrics", health.metrics)
    app.router.add_get("/healthz", health.healthz)
    app.router.add_get("/readyz", health.readyz)
    return app
