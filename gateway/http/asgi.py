"""One aiohttp request served by an ASGI application: what the MCP SDK's streamable HTTP
transport (ASGI) needs to run behind the gateway's own routes and middleware.

Why not the `aiohttp-asgi` package: once the body is read, its `receive()` keeps answering "an
empty body" without ever suspending. An application that listens for the client's disconnect
while it streams (sse-starlette does, for every event stream the MCP SDK sends) then loops
without yielding and freezes the event loop. ASGI says `receive()` waits there until the client
is gone. This bridge does that, and only HTTP: no WebSocket, no lifespan (the app runs the SDK's
session manager itself).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from multidict import CIMultiDict
from starlette.types import ASGIApp, Message, Scope

log = logging.getLogger("toolspan")


def _scope(request: web.Request, extra: Mapping[str, Any]) -> Scope:
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    local = transport.get_extra_info("sockname") if transport is not None else None
    return {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": f"{request.version.major}.{request.version.minor}",
        "method": request.method, "scheme": request.scheme, "root_path": "",
        "path": request.path, "raw_path": request.rel_url.raw_path.encode(),
        "query_string": request.query_string.encode(),
        "headers": [(name.lower(), value) for name, value in request.raw_headers],
        "client": tuple(peer[:2]) if isinstance(peer, tuple) else None,
        "server": tuple(local[:2]) if isinstance(local, tuple) else None,
        **extra,
    }


class _Exchange:
    """The `receive` and `send` of one request, whose body the gateway has read already."""

    def __init__(self, request: web.Request, body: bytes, closing: asyncio.Event | None) -> None:
        self.request = request
        self.response: web.StreamResponse | None = None
        self._body: bytes | None = body
        self._closing = closing
        self._answered = asyncio.Event()

    async def receive(self) -> Message:
        if self._body is not None:
            body, self._body = self._body, None
            return {"type": "http.request", "body": body, "more_body": False}
        # Wait for the end: aiohttp gives a handler no disconnect event, but with handler
        # cancellation on (as `toolspan serve` runs) a client that leaves cancels this wait.
        waits = [asyncio.ensure_future(self._answered.wait())]
        if self._closing is not None:
            waits.append(asyncio.ensure_future(self._closing.wait()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = CIMultiDict((bytes(k).decode("latin-1"), bytes(v).decode("latin-1"))
                                  for k, v in message.get("headers", ()))
            self.response = web.StreamResponse(status=message["status"], headers=headers)
            await self.response.prepare(self.request)
        elif message["type"] == "http.response.body" and self.response is not None:
            if body := message.get("body", b""):
                await self.response.write(body)
            if not message.get("more_body", False):
                await self.response.write_eof()
                self._answered.set()


async def serve_asgi(app: ASGIApp, request: web.Request, body: bytes, extra_scope: Mapping[str, Any], *,
                     closing: asyncio.Event | None = None) -> web.StreamResponse:
    """`request`, whose `body` the caller read (within the gateway's limits: a body that stalls
    or is too large is the caller's 408 or 413, before the app sees anything), answered by `app`
    with `extra_scope` added to its ASGI scope. `closing` being set reads as a disconnect (for
    long-lived event streams, when the gateway shuts down)."""
    exchange = _Exchange(request, body, closing)
    try:
        await app(_scope(request, extra_scope), exchange.receive, exchange.send)
    except Exception:
        if exchange.response is None:
            raise  # nothing sent yet: the gateway's middleware answers (a 500, logged)
        # The answer has begun and cannot become an error response any more: end it as it is.
        log.warning("%s %s failed while answering", request.method, request.path, exc_info=True)
    if exchange.response is None:
        raise RuntimeError(f"the ASGI application sent no answer to {request.method} {request.path}")
    return exchange.response
