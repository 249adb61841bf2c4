"""Every other /v1/... route: sent to the provider and answered byte for byte; its errors in
OpenAI's shape (gateway.routes.provider_errors)."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from urllib.parse import unquote

import aiohttp
import orjson
from aiohttp import web

from gateway.apis.registry import api_of_path, unserved
from gateway.errors import BadRequest, Forbidden, GatewayError, NotFound
from gateway.http.bodies import body_parts, check_declared_size, read_body, under
from gateway.http.keys import CALLER, RECORD, STATE, TRACE, UPSTREAMS
from gateway.instrumentation import RequestRecord
from gateway.provider.client import Upstream
from gateway.routes.provider_errors import provider_error
from gateway.routes.quota import within_limits
from gateway.routes.render import CLIENT_GONE
from gateway.state import no_such_response
from gateway.wire.headers import body_headers, from_provider

log = logging.getLogger("toolspan.upstream")

_SERVER_DECODES = frozenset({"gzip", "deflate", "br", "zstd"})  # aiohttp's request parser, same test


def _decoded_by_server(encoding: str) -> bool:
    return encoding.isascii() and encoding.lower() in _SERVER_DECODES


class _Body:
    """The caller's body on its way to the provider, within the route's limits; remembers why it
    stopped, when it failed (the provider call then fails too, but the caller's fault is the answer)."""

    def __init__(self, request: web.Request) -> None:
        self._request = request
        self.failure: GatewayError | None = None

    async def parts(self) -> AsyncIterator[bytes]:
        try:
            async for part in body_parts(self._request):
                yield part
        except GatewayError as exc:
            self.failure = exc
            raise


# A stored response and what hangs off it (input_items, cancel), as OpenAI and Azure address them; the
# routes below /responses that name no response are the API's own.
_STORED_RESPONSE = re.compile(r"/(?:v1|openai(?:/v1)?)/responses/([^/]+)")
_RESPONSES_ACTIONS = frozenset({"input_tokens", "compact"})


async def _check_owner(request: web.Request) -> None:
    """With gateway keys, a stored response is reached only by the key that made it: any other
    key is told it does not exist (a 404, as for an id no one made), and the provider is not asked."""
    caller = request[CALLER]
    match = _STORED_RESPONSE.match(request.path) if caller.principal is not None else None
    if match is None or match.group(1) in _RESPONSES_ACTIONS:
        return
    found = await request.app[STATE].lookup(caller.principal, (), (), match.group(1))
    if not found.owned:
        raise no_such_response(match.group(1))


# What separates path segments to some server: "\\" to a Windows one; a segment's ";params" are
# dropped by others (Tomcat's "..;/").
_SEGMENTS = re.compile(r"[/\\]")
_MAX_DECODINGS = 8  # each decoding that changes a path shortens it: a bound on a hostile one


def _dot_segments(path: str) -> bool:
    """Whether `path` (as aiohttp decoded it), or any form of it decoded again, holds a `.` or `..`
    segment. Decoded once, `%252e%252e` is `%2e%2e`: that is `..` once the outgoing URL is
    normalised, or once a provider decodes it again, and the provider's host is reached outside
    the surface the gateway was given (its admin or metrics routes)."""
    if "." not in path and "%" not in path:
        return False  # most paths: no dot, nothing left to decode
    for _ in range(_MAX_DECODINGS):
        if any(segment.split(";", 1)[0] in (".", "..") for segment in _SEGMENTS.split(path)):
            return True
        decoded = unquote(path)
        if decoded == path:
            return False
        path = decoded
    return True  # still encoded after so many decodings: no caller's path is


def check_route(request: web.Request) -> None:
    """A 404 for a path the provider would read as another, a 400 for a route of an API the
    upstream does not serve (Messages' count_tokens on an OpenAI upstream, say), a 403 for a route
    the key may not use."""
    if _dot_segments(request.path) or "//" in request.path:
        # The provider URL would be normalised past /v1 (or /openai), or to another route than the one
        # checked here (/v1//responses/ID is /responses/ID to the provider): never send the key there.
        raise NotFound("no such route", code="invalid_path")
    api = api_of_path(request.path)
    if api is not None and (refusal := unserved(request.app[UPSTREAMS], api, translated=False)) is not None:
        raise refusal
    routes = request[CALLER].routes
    if routes is not None and not any(under(request.path, prefix) for prefix in routes):
        raise Forbidden(f"{request.path} is not among the routes this key may use", code="not_allowed")


def _nowhere(request: web.Request) -> NotFound:
    return NotFound(f"{request.path} goes to no upstream: this gateway has no default_upstream", code="invalid_path")


async def holder(request: web.Request, response_id: str) -> Upstream:
    """The upstream that holds a provider response: the one that made it, with several upstreams
    (gateway.engine.rounds remembers it), else the Responses API's."""
    upstreams = request.app[UPSTREAMS]
    if upstreams.only is None:
        origins = await request.app[STATE].origins.get(request[CALLER].principal, (response_id,))
        if (origin := upstreams.clients.get(origins.get(response_id, ""))) is not None:
            return origin
    chosen = upstreams.for_route("responses")
    if chosen is None:
        raise _nowhere(request)
    return chosen


_DEPLOYMENT = re.compile(r"/openai/deployments/([^/]+)/")


async def destination(request: web.Request) -> tuple[Upstream, bytes | None]:
    """The upstream a request passed on goes to, and its body when it had to be read to say: a
    stored response's holder; with several upstreams, the one of the model the request names (its
    JSON body, or an Azure deployment path); else the default upstream. A key limited to models
    must name one of them (a 403 when the request's model cannot be read)."""
    upstreams, caller = request.app[UPSTREAMS], request[CALLER]
    if upstreams.only is not None and caller.models is None:  # one upstream: nothing to choose
        return upstreams.clients[upstreams.only], None
    stored = _STORED_RESPONSE.match(request.path)
    if stored is not None and stored.group(1) not in _RESPONSES_ACTIONS:
        return await holder(request, stored.group(1)), None
    chosen = upstreams.for_route(api_of_path(request.path))
    readable = request.method == "POST" and request.content_type.endswith("json")  # a body that names a model
    if caller.models is None and chosen is not None and (upstreams.only is not None or not readable):
        return chosen, None
    if (deployment := _DEPLOYMENT.match(request.path)) is not None:  # an Azure path names its model
        target = upstreams.route(unquote(deployment.group(1)), caller.models).primary[0]
        return upstreams.clients[target.upstream], None
    if not readable:
        if caller.models is not None and request.method == "POST":
            raise Forbidden("this key may use only some models, and the model of this request cannot be read "
                            "(a JSON body naming it)", code="not_allowed")
        if chosen is not None:
            return chosen, None
        raise _nowhere(request)
    return _by_model(request, chosen, await read_body(request))


def _by_model(request: web.Request, chosen: Upstream | None, sent: bytes) -> tuple[Upstream, bytes]:
    """The upstream of the model a JSON body names; a body that names none goes to `chosen`, when
    the key may use any model."""
    upstreams, caller = request.app[UPSTREAMS], request[CALLER]
    try:
        decoded = orjson.loads(sent)
    except ValueError:
        decoded = None
    model = decoded.get("model") if isinstance(decoded, dict) else None
    if not isinstance(model, str):
        if chosen is not None and caller.models is None:
            return chosen, sent
        raise BadRequest("this route goes to the upstream of the model its body names: name one", param="model")
    target = upstreams.route(model, caller.models).primary[0]
    if target.model != model and isinstance(decoded, dict):  # an alias: the provider's name goes on
        sent = orjson.dumps({**decoded, "model": target.model})
    return upstreams.clients[target.upstream], sent


async def passthrough(request: web.Request) -> web.StreamResponse:
    """Any other /v1 route: the caller's request to the provider, and its answer back, byte for byte."""
    check_route(request)
    await _check_owner(request)
    if request.method == "OPTIONS":  # a browser's preflight: the gateway's answers are not for web pages
        return web.Response(status=204, headers={"Allow": "GET, POST, DELETE"})
    return await within_limits(request, lambda: _passed(request))


async def _passed(request: web.Request) -> web.StreamResponse:
    upstream, sent = await destination(request)
    query = request[CALLER].provider_query(request.query_string)
    if (path := upstream.forward_path(f"{request.path}?{query}" if query else request.path)) is None:
        raise NotFound(f"no such route for this provider: {request.path}", code="invalid_path")
    # aiohttp's server has already decoded a compressed body: what goes on is the decoded bytes.
    decoded = _decoded_by_server(request.headers.get("Content-Encoding", ""))
    headers = {**upstream.headers(request[CALLER].upstream_headers), **body_headers(request.headers, decoded)}
    request[TRACE].inject(headers)  # the provider's spans join this request's trace
    check_declared_size(request)
    body = _Body(request)
    try:
        answer = await upstream.forward(request.method, path, headers,
                                        sent if sent is not None else body.parts() if request.body_exists else None)
    except GatewayError:
        if body.failure is not None:
            raise body.failure from None  # the provider call failed because the body did
        raise
    try:
        if answer.status >= 400:  # OpenAI-shaped, as every error of the gateway's (the middleware logs it)
            return await provider_error(answer)
        return await _relay(request, answer)
    finally:
        answer.release()


async def _relay(request: web.Request, answer: aiohttp.ClientResponse) -> web.StreamResponse:
    """The provider's answer to the caller as it arrives. A caller that leaves is a client gone,
    whichever the gateway hears first: the connection's end (the handler is cancelled) or a write
    that fails. A provider that breaks off ends the caller's answer unfinished, not as a 500."""
    response = web.StreamResponse(status=answer.status, reason=answer.reason,
                                  headers=from_provider(answer.headers, body_as_sent=True))
    try:
        await response.prepare(request)
        async for data in answer.content.iter_any():
            await response.write(data)
        await response.write_eof()
    except ConnectionResetError:  # aiohttp's ClientConnectionResetError, from a write to the caller
        response[RECORD] = RequestRecord(error_type=CLIENT_GONE)
    except (aiohttp.ClientError, TimeoutError):  # from a read of the provider's answer
        log.warning("%s %s: the provider's answer broke off [trace %s]", request.method, request.path,
                    request[TRACE].trace_id or "-")
        if request.transport is not None:
            request.transport.close()  # without the end of the body: the caller sees it cut short
        response[RECORD] = RequestRecord(error_type="upstream_error")
    return response
