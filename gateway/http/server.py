"""The HTTP server under the app: aiohttp's, with its own refusals in the OpenAI shape.

aiohttp answers a request its parser refuses (a bad request line, a header too long, a body whose
length is given twice ...) before any route or middleware sees it, in text/plain, and logs the
caller's junk as an error of its own. It has no public hook for that answer (aio-libs/aiohttp#3287
is open), so the server's connections are aiohttp's RequestHandler with `handle_error` overridden:
the one method aiohttp calls to build that answer.

Making those connections takes three private members of aiohttp: the runner's `_make_server` (the
step that turns the app into aiohttp's `web.Server`), and that server's `_kwargs` and `_loop` (what
it would make its own connections with). They are checked when the runner is made and when it
makes its server; where one is missing or of another shape, the runner serves aiohttp's own server
and its text/plain refusals, with one warning.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any

from aiohttp import __version__ as aiohttp_version
from aiohttp import web

from gateway.errors import error_response, internal_error, unreadable_request

log = logging.getLogger("toolspan.server")

_HANDLE_ERROR_PARAMETERS = ["self", "request", "status", "exc", "message"]  # as _Connection overrides it


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


def _runner_missing() -> str | None:
    """What GatewayRunner overrides and this aiohttp lacks, or None."""
    if not inspect.iscoroutinefunction(vars(web.AppRunner).get("_make_server")):
        return "no AppRunner._make_server"
    if list(inspect.signature(web.RequestHandler.handle_error).parameters) != _HANDLE_ERROR_PARAMETERS:
        return f"RequestHandler.handle_error does not take ({', '.join(_HANDLE_ERROR_PARAMETERS[1:])})"
    return None


def _server_missing(made: web.Server) -> str | None:
    """What `_Server` takes from aiohttp's server `made` and finds missing, or None."""
    if not isinstance(getattr(made, "_kwargs", None), dict):
        return "no Server._kwargs of type dict"
    if not isinstance(getattr(made, "_loop", None), asyncio.AbstractEventLoop):
        return "no Server._loop of type AbstractEventLoop"
    return None


def _warn(missing: str) -> None:
    log.warning("aiohttp %s: %s; requests aiohttp's parser refuses get its text/plain answers", aiohttp_version,
                missing)


class GatewayRunner(web.AppRunner):
    """web.AppRunner, serving the app through `_Server` where this aiohttp has what it needs."""

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._missing = _runner_missing()  # checked once: the same for every server this runner makes
        if self._missing is not None:
            _warn(self._missing)

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()  # the app started and frozen, aiohttp's server made for it
        if self._missing is not None:
            return made
        missing = _server_missing(made)
        if missing is not None:
            _warn(missing)
            return made
        kwargs: dict[str, Any] = made._kwargs
        return _Server(made.request_handler, request_factory=made.request_factory,
                       handler_cancellation=made.handler_cancellation, loop=made._loop, **kwargs)
