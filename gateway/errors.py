"""The GatewayError family and the one mapping from errors to OpenAI-shaped HTTP responses."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
    "transfer-encoding", "upgrade", "content-length", "host",
})


# Provider answers that would tell callers which account is behind the gateway, or set cookies
# on the gateway's origin.
_PRIVATE = frozenset({"openai-organization", "openai-project", "set-cookie"})


def provider_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers of a provider answer that may reach the caller."""
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP and k.lower() not in _PRIVATE}


class GatewayError(Exception):
    """An error that becomes an OpenAI error response. The message is meant for the caller."""

    status = 500
    type = "server_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        if status is not None:
            self.status = status

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class BadRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class Unauthorized(GatewayError):
    status = 401
    type = "authentication_error"


class Forbidden(GatewayError):
    status = 403
    type = "permission_error"


class NotFound(GatewayError):
    status = 404
    type = "not_found_error"


class Conflict(GatewayError):
    status = 409
    type = "conflict_error"


class TooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"


class UpstreamUnavailable(GatewayError):
    """The provider could not be reached, failed, or sent something unreadable."""

    status = 502
    type = "upstream_error"


class UpstreamTimeout(GatewayError):
    status = 504
    type = "upstream_timeout"


class UpstreamRefused(GatewayError):
    """The provider answered 4xx (including 429): its answer goes to the caller unchanged."""

    type = "upstream_refused"

    def __init__(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        super().__init__(f"upstream answered {status}", status=status)
        self.raw_body = body
        self.headers = provider_headers(headers)  # the body is forwarded as it came, encoding and all

    def body(self) -> dict[str, Any]:
        try:
            decoded = json.loads(self.raw_body)
        except ValueError:
            decoded = None
        if isinstance(decoded, dict) and isinstance(decoded.get("error"), dict):
            return decoded
        text = self.raw_body.decode("utf-8", "replace")[:1000]
        return {"error": {"message": f"upstream answered {self.status}: {text}", "type": "upstream_error",
                          "param": None, "code": None}}


def error_response(error: GatewayError) -> web.Response:
    """The single place errors become HTTP."""
    if isinstance(error, UpstreamRefused):
        return web.Response(status=error.status, body=error.raw_body, headers=error.headers)
    return web.json_response(error.body(), status=error.status)


def from_http_exception(exc: web.HTTPException) -> GatewayError:
    """aiohttp's own refusals (404, 405, 413 ...) in the OpenAI shape."""
    if exc.status == 413:
        # aiohttp's text is a whole sentence ("Maximum request body size N exceeded."), not a size.
        detail = f": {exc.text}" if exc.text else ""
        return TooLarge(f"the request body is too large{detail}", code="body_too_large")
    kinds: dict[int, type[GatewayError]] = {400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound}
    kind = kinds.get(exc.status, GatewayError)
    return kind(exc.reason or "request refused", status=exc.status)


def internal_error() -> GatewayError:
    return GatewayError("the gateway failed to handle this request; the failure has been logged",
                        code="internal_error")
