"""Liveness, readiness and the metrics exposition."""

from __future__ import annotations

from aiohttp import web

from gateway.app_keys import ENGINE, INSTRUMENTATION


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    ready = ENGINE in request.app
    return web.json_response({"status": "ready" if ready else "starting"}, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    body, content_type = request.app[INSTRUMENTATION].exposition(request.headers.get("Accept"))
    response = web.Response(body=body)
    response.headers["Content-Type"] = content_type
    return response
