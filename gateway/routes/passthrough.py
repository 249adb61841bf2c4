"""Every other /v1/... route: sent to the provider and answered byte for byte."""

from __future__ import annotations

from aiohttp import web

from gateway.errors import HOP_BY_HOP
from gateway.keys import UPSTREAM


async def passthrough(request: web.Request) -> web.StreamResponse:
    upstream = request.app[UPSTREAM]
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP and k.lower() != "authorization"}
    headers.update(upstream.auth_headers(request.headers.get("Authorization")))
    body = request.content.iter_any() if request.body_exists else None
    answer = await upstream.forward(request.method, request.path_qs.removeprefix("/v1"), headers, body)
    try:
        kept = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP}
        response = web.StreamResponse(status=answer.status, reason=answer.reason, headers=kept)
        await response.prepare(request)
        async for data in answer.content.iter_any():
            await response.write(data)
        await response.write_eof()
        return response
    finally:
        answer.release()
