"""The message cap (`mcp_max_message_bytes`) for MCP servers over streamable HTTP.

The `mcp` client bounds each server-sent event itself (`max_sse_event_size`), but reads a JSON
answer whole (`response.aread()`). A response hook of the connection's httpx client puts a
counting stream in front of such a body: past the cap it raises a `StreamError`, which the client
takes as an unreadable answer, so that the call fails and nothing more of the body is read."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx2

log = logging.getLogger("toolspan.mcp")


class AnswerTooLarge(httpx2.StreamError):
    """A server's answer longer than the cap."""


class _CappedBody(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, limit: int, server: str) -> None:
        self._inner = inner
        self._limit = limit
        self._server = server

    async def __aiter__(self) -> AsyncIterator[bytes]:
        read = 0
        async for chunk in self._inner:
            read += len(chunk)
            if read > self._limit:
                log.warning("MCP server %r sent an answer longer than %d bytes (mcp_max_message_bytes); that call "
                            "fails", self._server, self._limit)
                raise AnswerTooLarge(f"the server's answer is longer than {self._limit} bytes "
                                     "(mcp_max_message_bytes)")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


def capped_json_bodies(limit: int, server: str) -> Callable[[httpx2.Response], Awaitable[None]]:
    """A `response` event hook bounding the bytes of JSON bodies, as received (before decoding)."""

    async def cap(response: httpx2.Response) -> None:
        if response.headers.get("content-type", "").lower().startswith("application/json") and \
                isinstance(response.stream, httpx2.AsyncByteStream):
            response.stream = _CappedBody(response.stream, limit, server)

    return cap
