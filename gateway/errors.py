"""The GatewayError family and the one mapping from errors to OpenAI-shaped HTTP responses."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aiohttp import web

from gateway.wire.headers import from_provider

log = logging.getLogger("toolspan.upstream")

# Anthropic's "overloaded" (overloaded_error), a status of its own outside HTTP's: Anthropic's SDKs
# retry it; in OpenAI's shape it is a 503, which every HTTP client reads as "try again later".
OVERLOADED = 529


class GatewayError(Exception):
    """An error that becomes an OpenAI error response. The message is meant for the caller."""

    status = 500
    type = "server_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 status: int | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers: Mapping[str, str] = headers or {}  # the provider's, when it answered
        if status is not None:
            self.status = status

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    @property
    def openai_status(self) -> int:
        """The status of this error in OpenAI's shape: Anthropic's own 529 is a 503 there."""
        return 503 if self.status == OVERLOADED else self.status


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


class RequestTimeout(GatewayError):
    """The caller stopped sending its body."""

    status = 408
    type = "invalid_request_error"


class TooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"


class Unavailable(GatewayError):
    """The gateway cannot take this request now (too many at once, or shutting down): try again."""

    status = 503
    type = "server_error"

    def __init__(self, message: str, *, code: str, retry_after: int = 1) -> None:
        super().__init__(message, code=code, headers={"Retry-After": str(retry_after)})


class UpstreamUnavailable(GatewayError):
    """The provider could not be reached, failed, or sent something unreadable. `retryable`: the
    failure says the same request may succeed later (a 5xx meaning "again", a broken connection)."""

    status = 502
    type = "upstream_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 status: int | None = None, headers: Mapping[str, str] | None = None,
                 retryable: bool = False) -> None:
        super().__init__(message, param=param, code=code, status=status, headers=headers)
        self.retryable = retryable


def provider_status(status: int) -> int | None:
    """The status a provider's 5xx is told with: Anthropic's 529 (overloaded) as it came, for its
    clients to retry it as such; any other is a 502 (None: the class's own)."""
    return OVERLOADED if status == OVERLOADED else None


def stream_error(error: Mapping[str, Any]) -> UpstreamUnavailable:
    """An error event in a provider's stream (`error`: its error object). Anthropic's
    overloaded_error is its 529 said after the 200: the same request may work later, and it keeps
    its type (a 529) on its way to the client."""
    overloaded = error.get("type") == "overloaded_error"
    return UpstreamUnavailable(f"the provider reported an error mid-stream: {error.get('message') or 'unknown'}",
                               code="upstream_overloaded" if overloaded else None,
                               status=OVERLOADED if overloaded else None, retryable=overloaded)


class FailedAfterTools(UpstreamUnavailable):
    """A provider failure in a request for which the gateway had already run tools (and retried
    the provider itself, where the failure allowed): final, so that the client's SDK does not send
    the request again and run the tools again. `x-should-retry: false` is what openai-python and
    openai-node read; the provider's retry-after stays behind for the same reason."""

    def __init__(self, cause: GatewayError, tools: Sequence[str], attempts: int, resumable: bool) -> None:
        detail = cause.body().get("error")
        said = detail.get("message") if isinstance(detail, Mapping) else None
        ran = ", ".join(dict.fromkeys(tools))
        tried = f" (tried {attempts} times)" if attempts > 1 else ""
        after = ("sending the same request again within a few minutes resumes after them, without running them "
                 "again" if resumable else "sending the request again would run them again")
        message = (f"{said if isinstance(said, str) and said else cause.message}{tried}; the gateway had already "
                   f"run its tools for this request ({ran}): {after}")
        kept = {k: v for k, v in cause.headers.items() if k.lower() not in _RETRY_HEADERS}
        super().__init__(message, code="upstream_failed_after_tools", status=cause.status,
                         headers={**kept, "x-should-retry": "false"})
        kind = detail.get("type") if isinstance(detail, Mapping) else None
        self.type = kind if isinstance(kind, str) and kind else cause.type
        self.tools = tuple(dict.fromkeys(tools))


_RETRY_HEADERS = frozenset({"retry-after", "retry-after-ms", "x-should-retry"})


class UpstreamTimeout(GatewayError):
    status = 504
    type = "upstream_timeout"


class UpstreamRefused(GatewayError):
    """The provider answered 4xx (including 429): its error goes to the caller as it came, with
    the provider's headers (retry-after, request id ...)."""

    type = "upstream_refused"

    def __init__(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        super().__init__(f"the provider answered {status}", status=status, headers=from_provider(headers))
        self.raw_body = body
        self.as_sent = from_provider(headers, body_as_sent=True)

    def provider_error(self) -> bool:
        """The provider sent an OpenAI-shaped error, which can go on byte for byte."""
        try:
            decoded = json.loads(self.raw_body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return False
        return isinstance(decoded, dict) and isinstance(decoded.get("error"), dict)

    def body(self) -> dict[str, Any]:
        if self.provider_error():
            decoded: dict[str, Any] = json.loads(self.raw_body)
            return decoded
        text = self.raw_body.decode("utf-8", "replace").strip()[:1000]
        return {"error": {"message": f"the provider answered {self.status}: {text or '(no body)'}",
                          "type": "upstream_error", "param": None, "code": f"upstream_{self.status}"}}


def openai_body(error: GatewayError) -> Mapping[str, Any]:
    """An error in OpenAI's shape, as its own class words it."""
    return error.body()


def error_response(error: GatewayError,
                   body_of: Callable[[GatewayError], Mapping[str, Any]] = openai_body) -> web.Response:
    """The single place errors become HTTP: in OpenAI's shape (with its status: openai_status),
    unless `body_of` gives the error in the shape of the API the caller speaks
    (gateway.apis.error_body_for). A provider's own error goes on as it came."""
    if isinstance(error, UpstreamRefused) and error.provider_error():
        return web.Response(status=error.status, body=error.raw_body, headers=error.as_sent)
    status = error.openai_status if body_of is openai_body else error.status
    response = web.json_response(body_of(error), status=status)
    response.headers.extend(error.headers)
    return response


def from_http_exception(exc: web.HTTPException) -> GatewayError:
    """aiohttp's own refusals (404, 405, 413 ...) in the OpenAI shape: the caller's fault (4xx) is an
    invalid_request_error unless a narrower type fits."""
    if exc.status == 413:
        # aiohttp's text is a whole sentence ("Maximum request body size N exceeded."), not a size.
        detail = f": {exc.text}" if exc.text else ""
        return TooLarge(f"the request body is too large{detail}", code="body_too_large")
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(exc.allowed_methods))
        return BadRequest(f"{exc.method} is not allowed here (allowed: {allowed})", status=405,
                          code="method_not_allowed", headers={"Allow": exc.headers.get("Allow", allowed)})
    kinds: dict[int, type[GatewayError]] = {401: Unauthorized, 403: Forbidden, 404: NotFound}
    kind = kinds.get(exc.status, BadRequest if exc.status < 500 else GatewayError)
    return kind(exc.reason or "request refused", status=exc.status)


def unreadable_request(status: int, reason: str) -> GatewayError:
    """A request aiohttp's parser refused before any route saw it (a bad request line, a header
    too long ...): the caller's fault, said in a line."""
    detail = " ".join(reason.split())[:200]
    kind = BadRequest if status < 500 else GatewayError
    return kind(f"the request is not valid HTTP: {detail or 'malformed'}", status=status, code="bad_request")


def log_provider_failure(error: GatewayError, method: str, path: str, trace_id: str | None) -> None:
    """Log a failed provider call, once, where it became the caller's answer (refusals are the
    caller's or the provider's business: info; failures and timeouts: warning)."""
    if isinstance(error, UpstreamRefused):
        log.info("%s %s: the provider refused (%d) [trace %s]", method, path, error.status, trace_id or "-")
    elif isinstance(error, UpstreamUnavailable | UpstreamTimeout):
        # The caller's message leaves the provider's address out; the operator's log has it.
        cause = f" ({error.__cause__})" if error.__cause__ is not None and str(error.__cause__) else ""
        log.warning("%s %s: %s%s (%d) [trace %s]", method, path, error.message, cause, error.status, trace_id or "-")


def shutting_down() -> Unavailable:
    return Unavailable("the gateway is shutting down; send the request again", code="shutting_down")


def internal_error() -> GatewayError:
    return GatewayError("the gateway failed to handle this request; the failure has been logged",
                        code="internal_error")
