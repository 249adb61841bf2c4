"""POST /v1/chat/completions: the tool loop behind the OpenAI Chat Completions API."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from gateway.errors import BadRequest, GatewayError, internal_error
from gateway.keys import LOOP
from gateway.loop import LoopResult
from gateway.routes.common import caller_of, read_object, scope

log = logging.getLogger("toolspan")

ROUND_LIMIT_HEADER = "X-Toolspan-Round-Limit"
ROUNDS_HEADER = "X-Toolspan-Rounds"


@dataclass(frozen=True)
class ChatRequest:
    """What the gateway reads from a chat request; the body itself goes on to the provider."""

    stream: bool
    metadata: Any


def _invalid(where: str, expected: str) -> BadRequest:
    return BadRequest(f"not a chat completion request: {where}: expected {expected}", param=where.split(".")[0])


def validate(body: dict[str, Any]) -> ChatRequest:
    """Check the fields the gateway relies on; everything else is the provider's to judge. Plain
    checks rather than a schema library: this runs on every request, on its critical path."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _invalid("model", "a non-empty string")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid("messages", "a non-empty array of messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _invalid(f"messages.{i}", "a message object")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise _invalid("tools", "an array of tools")
    for i, spec in enumerate(tools or ()):
        if not isinstance(spec, dict) or not isinstance(spec.get("type"), str):
            raise _invalid(f"tools.{i}", "a tool object with a type")
        function = spec.get("function")  # tools of other types (custom, ...) are the provider's business
        if function is not None and not (isinstance(function, dict) and isinstance(function.get("name"), str)
                                         and function["name"]):
            raise _invalid(f"tools.{i}.function.name", "a non-empty string")
    for field, kind, expected in (("stream", bool, "a boolean"), ("stream_options", dict, "an object"),
                                  ("metadata", dict, "an object")):
        if body.get(field) is not None and not isinstance(body[field], kind):
            raise _invalid(field, expected)
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise _invalid("n", "an integer of at least 1")
    return ChatRequest(stream=bool(body.get("stream")), metadata=body.get("metadata"))


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
