"""POST /v1/chat/completions: the tool loop behind the OpenAI Chat Completions API."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.errors import BadRequest, GatewayError, internal_error
from gateway.keys import LOOP
from gateway.loop import LoopResult
from gateway.routes.common import caller_of, read_object, scope

log = logging.getLogger("toolspan")

ROUND_LIMIT_HEADER = "X-Toolspan-Round-Limit"
ROUNDS_HEADER = "X-Toolspan-Rounds"


class _Function(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    name: str = Field(min_length=1)


class _ToolSpec(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: str
    function: _Function | None = None  # tools of other types (custom, ...) are the provider's business


class ChatRequest(BaseModel):
    """The fields the gateway relies on; everything else goes to the provider untouched. Strict
    types, as OpenAI's API has them: `"stream": "true"` or `"n": 1.0` is refused, not coerced."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str = Field(min_length=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[_ToolSpec] | None = None
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    n: int | None = Field(None, ge=1)
    metadata: dict[str, Any] | None = None


def validate(body: dict[str, Any]) -> ChatRequest:
    try:
        return ChatRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise BadRequest(f"not a chat completion request: {where}: {first['msg']}",
                         param=str(first["loc"][0]) if first["loc"] else None) from exc


class ClientGone(Exception):
    """The client closed the connection while we were streaming to it."""


class SseSink:
    """The client's SSE response, started on the first write."""

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                                    "X-Accel-Buffering": "no"})

    @property
    def started(self) -> bool:
        return self.response.prepared

    async def _write(self, data: bytes) -> None:
        try:
            if not self.response.prepared:
                await self.response.prepare(self.request)
            await self.response.write(data)
        except (ConnectionResetError, aiohttp.ClientConnectionResetError) as exc:
            raise ClientGone from exc

    async def send(self, chunk: dict[str, Any]) -> None:
        await self._write(b"data: " + orjson.dumps(chunk) + b"\n\n")

    async def comment(self, text: str) -> None:
        await self._write(f": {text}\n\n".encode())

    async def close(self) -> None:
        await self._write(b"data: [DONE]\n\n")
        await self.end()

    async def end(self) -> None:
        try:
            await self.response.write_eof()
        except (ConnectionResetError, aiohttp.ClientConnectionResetError) as exc:
            raise ClientGone from exc


def _round_headers(result: LoopResult) -> dict[str, str]:
    headers = {ROUNDS_HEADER: str(result.rounds)}
    if result.limit_reached:
        headers[ROUND_LIMIT_HEADER] = "reached"
    return headers


async def chat_completions(request: web.Request) -> web.StreamResponse:
    body = await read_object(request)
    chat = validate(body)
    caller = caller_of(request, chat.metadata)
    loop = request.app[LOOP]
    plan = loop.plan(body, caller)
    trace = scope(request).trace
    if not chat.stream:
        response, result = await loop.complete(plan, caller)
        trace.rounds(result.rounds, result.limit_reached)
        return web.Response(body=orjson.dumps(response), content_type="application/json",
                            headers=_round_headers(result))

    sink = SseSink(request)
    try:
        result = await loop.stream(plan, caller, sink)
        trace.rounds(result.rounds, result.limit_reached)
        if result.limit_reached:
            await sink.comment(f"toolspan: round limit reached after {result.rounds} model turns")
        await sink.close()
    except ClientGone:
        scope(request).error_type = "client_disconnected"
    except Exception as exc:
        if not sink.started:
            raise  # nothing sent yet: an ordinary error response
        # The 200 and part of the answer are out: the failure can only be an event in the stream.
        error = exc if isinstance(exc, GatewayError) else internal_error()
        if not isinstance(exc, GatewayError):
            log.exception("stream failed after it began")
        scope(request).error_type = error.type
        await _send_error(sink, error)
    return sink.response


async def _send_error(sink: SseSink, error: GatewayError) -> None:
    try:
        await sink.send(error.body())
        await sink.end()
    except ClientGone:
        pass  # the client left as well; the spans already say what went wrong
