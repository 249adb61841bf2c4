"""Every other /v1/... route: sent to the provider and answered byte for byte."""

from __future__ import annotations

import logging

from aiohttp import web

from gateway.app_keys import CALLER, TRACE, UPSTREAM
from gateway.errors import NotFound
from gateway.headers import body_headers, from_provider

log = logging.getLogger("toolspan.upstream")

_SERVER_DECODES = frozenset({"gzip", "deflate", "br", "zstd"})  # aiohttp's request parser, same test


def _decoded_by_server(encoding: str) -> bool:
    return encoding.isascii() and encoding.lower() in _SERVER_DECODES


async def passthrough(request: web.Request) -> web.StreamResponse:
    """Any other /v1 route: the caller's request to the provider, and its answer back, byte for byte."""
    if any(part in (".", "..") for part in request.match_info.get("tail", "").split("/")):
        # The provider URL would be normalised past /v1: never send the key there.
        raise NotFound("no such route", code="invalid_path")
    if request.method == "OPTIONS":  # a browser's preflight: the gateway's answers are not for web pages
        return web.Response(status=204, headers={"Allow": "GET, POST, DELETE"})
    upstream = request.app[UPSTREAM]
    if (path := upstream.forward_path(request.path_qs)) is None:
        raise NotFound(f"no such route for this provider: {request.path}", code="invalid_path")
    # aiohttp's server has already decoded a compressed body: what goes on is the decoded bytes.
    decoded = _decoded_by_server(request.headers.get("Content-Encoding", ""))
    headers = {**upstream.headers(request[CALLER].upstream_headers), **body_headers(request.headers, decoded)}
    request[TRACE].inject(headers)  # the provider's spans join this request's trace
    body = request.content.iter_any() if request.body_exists else None
    answer = await upstream.forward(request.method, path, headers, body)
    if answer.status >= 500:
        log.warning("%s %s: the provider answered %d [trace %s]", request.method, request.path, answer.status,
                    request[TRACE].trace_id or "-")
    try:
        response = web.StreamResponse(status=answer.status, reason=answer.reason,
                                      headers=from_provider(answer.headers, body_as_sent=True))
        await response.prepare(request)
        async for data in answer.content.iter_any():
            await response.write(data)
        await response.write_eof()
        return response
    finally:
        answer.release()
