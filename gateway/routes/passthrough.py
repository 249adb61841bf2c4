"""Every other /v1/... route: sent to the provider and answered byte for byte."""

from __future__ import annotations

from aiohttp import web

from gateway.app_keys import CALLER, TRACE, UPSTREAM
from gateway.errors import HOP_BY_HOP, NotFound, provider_headers

_TRACE_CONTEXT = ("traceparent", "tracestate")
_SERVER_DECODES = frozenset({"gzip", "deflate", "br", "zstd"})  # aiohttp's request parser, same test


def _decoded_by_server(encoding: str) -> bool:
    return encoding.isascii() and encoding.lower() in _SERVER_DECODES


async def passthrough(request: web.Request) -> web.StreamResponse:
    if any(part in (".", "..") for part in request.match_info.get("tail", "").split("/")):
        # The provider URL would be normalised past /v1: never send the key there.
        raise NotFound("no such route", code="invalid_path")
    upstream = request.app[UPSTREAM]
    dropped = HOP_BY_HOP | {"authorization", *_TRACE_CONTEXT}
    if _decoded_by_server(request.headers.get("Content-Encoding", "")):
        # aiohttp's server has already decoded this body: what we forward is the decoded
        # bytes, so the header describing the encoding must go too.
        dropped |= {"content-encoding"}
    headers = {k: v for k, v in request.headers.items() if k.lower() not in dropped}
    headers.update(upstream.auth_headers(request[CALLER].upstream_authorization))
    trace_context = {k: request.headers[k] for k in _TRACE_CONTEXT if k in request.headers}
    request[TRACE].inject(trace_context)  # the provider's spans join this request's trace
    headers.update(trace_context)
    body = request.content.iter_any() if request.body_exists else None
    answer = await upstream.forward(request.method, request.path_qs.removeprefix("/v1"), headers, body)
    try:
        kept = provider_headers(answer.headers)
        response = web.StreamResponse(status=answer.status, reason=answer.reason, headers=kept)
        await response.prepare(request)
        async for data in answer.content.iter_any():
            await response.write(data)
        await response.write_eof()
        return response
    finally:
        answer.release()
