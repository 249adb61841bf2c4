"""Reading a request's body, for every route: within the route's size limit and the body read
timeout, its declared type checked, JSON decoded within the depth limit; and the `Expect` header."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp import HttpVersion11, web

from gateway.apis.registry import error_body_for
from gateway.errors import BadRequest, RequestTimeout, TooLarge, error_response
from gateway.http.keys import SETTINGS
from gateway.wire.json_depth import decoded_nests_deeper

UPLOADS = ("/v1/files", "/v1/uploads", "/openai/files", "/openai/uploads", "/openai/v1/files", "/openai/v1/uploads")
_BELOW_UPLOADS = tuple(f"{prefix}/" for prefix in UPLOADS)  # what lies under them, for one startswith
JSON_TYPE = "application/json"


async def expect_continue(request: web.Request) -> web.Response | None:
    """The `Expect` header, for every route: `100-continue` answered as aiohttp answers it, any
    other expectation a 417 in OpenAI's shape (aiohttp's own is plain text, and is sent before any
    middleware could reshape it)."""
    expect = request.headers.get("Expect", "")
    if expect.lower() != "100-continue":
        return error_response(BadRequest(f"the expectation {expect!r} is not one the gateway meets "
                                         "(only 100-continue is)", status=417, code="expectation_failed"),
                              error_body_for(request.path, request.headers))
    if request.version == HttpVersion11:
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the interim answer is not part of the response's size
    return None


EXPECT: dict[str, Any] = {"expect_handler": expect_continue}  # how every route is added


def under(path: str, prefix: str) -> bool:
    """`path` is `prefix` or lies below it (/v1/models/x is under /v1/models; /v1/modelsx is not)."""
    prefix = prefix.rstrip("/")
    return path == prefix or path.startswith(prefix + "/")


def body_limit(request: web.Request) -> int:
    """The largest body the request's route takes, decoded: upload routes have their own."""
    settings = request.app[SETTINGS]
    path = request.path
    uploading = path in UPLOADS or path.startswith(_BELOW_UPLOADS)  # under() each, without six calls
    return settings.max_upload_bytes if uploading else settings.max_body_bytes


async def body_parts(request: web.Request) -> AsyncIterator[bytes]:
    """The request body as it arrives, decoded (aiohttp's parser inflates gzip, deflate, br and
    zstd), held to the route's size limit and the body read timeout. A 413 as soon as the decoded
    size crosses the limit, a 408 when the client stops sending, a 400 when the body does not
    decode (a broken gzip stream, say)."""
    body = _BodyReader(request)
    while part := await body.next_part():
        yield part


async def read_body(request: web.Request) -> bytes:
    """The whole request body, as body_parts gives it, in a plain loop rather than through the
    generator, which costs a plain request more CPU (docs/benchmarks.md)."""
    body = _BodyReader(request)
    parts = []
    while part := await body.next_part():
        parts.append(part)
    return b"".join(parts)


class _BodyReader:
    """A request body's parts, within the route's limits (see body_parts)."""

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.limit = check_declared_size(request)
        self.timeout = request.app[SETTINGS].body_read_timeout_seconds
        self.received = 0

    async def next_part(self) -> bytes:
        """The next part, b"" at the end: what is buffered already, else the next read, waited for
        no longer than the timeout (the timer runs only when there is a wait: most bodies have
        arrived with their head)."""
        content = self.request.content
        try:
            if not (part := content.read_nowait()) and not content.at_eof():
                async with asyncio.timeout(self.timeout):
                    part = await content.readany()
        except TimeoutError as exc:
            _stop_reading(self.request)
            raise RequestTimeout(f"the request body stalled: nothing arrived for {self.timeout:g} s",
                                 code="request_timeout") from exc
        except web.RequestPayloadError as exc:
            _stop_reading(self.request)
            raise BadRequest(f"the request body could not be read ({exc}); check its Content-Encoding "
                             "and Transfer-Encoding", code="invalid_body") from exc
        self.received += len(part)
        if self.received > self.limit:
            raise _too_large(self.limit)
        return part


def _stop_reading(request: web.Request) -> None:
    """No more of this body will be read, and the connection closes after the answer: the body
    stalled, or broke (aiohttp's parser has lost its place). Otherwise aiohttp would go on reading
    it after the answer, wait for it, and log its failure as one of its own."""
    request.content.feed_eof()
    request.protocol.close()


def check_declared_size(request: web.Request) -> int:
    """The route's body limit; a 413 at once when an uncompressed body says it is larger
    (Content-Length), before anything of it is read or sent on."""
    limit = body_limit(request)
    if "Content-Encoding" not in request.headers and (request.content_length or 0) > limit:
        raise _too_large(limit)
    return limit


def _too_large(limit: int) -> TooLarge:
    return TooLarge(f"the request body is larger than {limit} bytes (decoded)", code="body_too_large")


def require_json(request: web.Request, *, structured_suffix: bool = True) -> None:
    """A 415 unless the request says its body is JSON: application/json, or (`structured_suffix`)
    a type such as application/merge-patch+json, any parameters. A browser sends a cross-site
    form or text/plain body without asking first; one typed JSON it sends only if the gateway
    agreed to it in a preflight, which it never does: so no web page can make a browser post a
    body that a JSON route reads."""
    declared = request.headers.get("Content-Type")
    if declared == JSON_TYPE:  # what nearly every client sends: no parsing
        return
    media = (declared or "").partition(";")[0].strip().lower()
    if media == JSON_TYPE or (structured_suffix and media.startswith("application/") and media.endswith("+json")):
        return
    got = f"is {media[:100]!r}" if media else "is missing"
    raise BadRequest(f"the Content-Type header {got}: this route reads a JSON body, sent as {JSON_TYPE}",
                     status=415, code="unsupported_media_type")


async def read_object(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object (a 415 unless it is declared JSON), or a 400 saying what is wrong with it."""
    require_json(request)
    raw = await read_body(request)
    limit = request.app[SETTINGS].max_json_depth
    try:
        body = orjson.loads(raw)  # the hot path: orjson is several times faster than json here
    except orjson.JSONDecodeError as exc:
        if exc.msg.startswith("depth limit"):  # orjson stops at 1024 levels, far past ours
            raise _too_deep(limit) from exc
        raise BadRequest(f"the request body is not valid JSON ({exc})", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object", code="invalid_json")
    # A 400 when it nests arrays and objects deeper than `limit` (a document this deep is no one's
    # real request, and past 255 levels the gateway could not even encode it again).
    if decoded_nests_deeper(raw, body, limit):
        raise _too_deep(limit)
    return body


def _too_deep(limit: int) -> BadRequest:
    return BadRequest(f"the request body nests arrays and objects more than {limit} levels deep (max_json_depth)",
                      code="invalid_json")
