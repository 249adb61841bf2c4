"""The HTTP server under the app: aiohttp's, with its own refusals in the OpenAI shape.

aiohttp answers a request its parser refuses (a bad request line, a header too long, a body whose
length is given twice ...) before any route or middleware sees it, in text/plain, and logs the
caller's junk as an error of its own. It has no public hook for that answer (aio-libs/aiohttp#3287
is open), so the server's connections are aiohttp's RequestHandler with `handle_error` overridden:
the one method aiohttp calls to build that answer.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.errors import error_response, internal_error, unreadable_request


class _Connection(web.RequestHandler):
    """One client connection, as aiohttp runs it; its refusals are OpenAI-shaped errors."""

    def handle_error(self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if request.writer.output_size > 0:
            # Part of an answer is out: no error can follow it (aiohttp's own rule; the connection closes).
            raise ConnectionError("the answer had begun when the request failed")
        if status >= 500:
            self.log_exception("error handling a request from %s", request.remote, exc_info=exc)
            error = internal_error()
        else:  # the client's fault: worth a debug line at most
            self.logger.debug("refused a request from %s: %s", request.remote, message or exc)
            error = unreadable_request(status, message or "")
        response = error_response(error)
        response.set_status(status)
        response.force_close()  # the parser cannot find where the next request would start
        return response


class _Server(web.Server):
    """aiohttp's low-level server, making `_Connection`s (as web.Server.__call__ makes its own)."""

    def __call__(self) -> web.RequestHandler:
        return _Connection(self, loop=self._loop, **self._kwargs)


class GatewayRunner(web.AppRunner):
    """web.AppRunner, serving the app through `_Server`."""

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()  # the app started and frozen, aiohttp's server made for it
        kwargs: dict[str, Any] = made._kwargs
        return _Server(made.request_handler, request_factory=made.request_factory,
                       handler_cancellation=made.handler_cancellation, loop=made._loop, **kwargs)
