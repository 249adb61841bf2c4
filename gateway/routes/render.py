"""Answering: a plan's run as one JSON body, or as server-sent events through the API's stream
renderer (every API's tool-loop route ends here), and what every route's answer carries: its
trajectory, its rounds, and what telemetry records of it."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping
from contextlib import aclosing
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from gateway.apis.base import Frame, StreamRenderer, WireApi
from gateway.caller import Caller
from gateway.engine import Event, Finished, Keepalive, Opened, Plan, ToolsRan, ToolsStarted, Visible
from gateway.errors import GatewayError, internal_error, log_provider_failure
from gateway.http.keys import RECORD, TRACE
from gateway.instrumentation import RequestRecord
from gateway.wire.headers import TRAJECTORY_HEADER

ROUND_LIMIT_HEADER = "X-Toolspan-Round-Limit"
ROUNDS_HEADER = "X-Toolspan-Rounds"
CLIENT_GONE = "client_disconnected"  # a request's error type when its client left before the answer was out
log = logging.getLogger("toolspan")



class ClientGone(Exception):
    """The client closed the connection while we were streaming to it."""


class SseWriter:
    """The client's SSE response, started on the first write."""

    def __init__(self, request: web.Request, headers: Mapping[str, str]) -> None:
        self.request = request
        self.response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                                    "X-Accel-Buffering": "no", **headers})

    @property
    def started(self) -> bool:
        return self.response.prepared

    def provider_headers(self, headers: Mapping[str, str]) -> None:
        """The provider's headers, for the response not yet started (the gateway's own win)."""
        if not self.response.prepared:
            for name, value in headers.items():
                self.response.headers.setdefault(name, value)

    async def write(self, data: bytes) -> None:
        try:
            if not self.response.prepared:
                await self.response.prepare(self.request)
            await self.response.write(data)
        except (ConnectionResetError, aiohttp.ClientConnectionResetError) as exc:
            raise ClientGone from exc

    async def frames(self, frames: Iterable[Frame]) -> None:
        for name, payload in frames:
            head = b"event: " + name.encode() + b"\n" if name else b""
            await self.write(head + b"data: " + orjson.dumps(payload) + b"\n\n")

    async def comment(self, text: str) -> None:
        await self.write(f": {text}\n\n".encode())


async def answer(request: web.Request, caller: Caller, api: WireApi, plan: Plan,
                 events: AsyncGenerator[Event, None]) -> web.StreamResponse:
    """Answer with a run of `plan` (of `api`): the API's JSON answer, or, for a streamed request,
    its events."""
    if plan.stream:
        return await stream(request, caller, api, plan, events)
    finished = await finished_of(events)
    headers = {**finished.turns[-1].headers, **answer_headers(caller, finished)}
    body = orjson.dumps(api.as_json(plan, finished))
    response = web.Response(body=body, content_type="application/json", headers=headers)
    return reported(response, caller, finished)


async def stream(request: web.Request, caller: Caller, api: WireApi, plan: Plan,
                 events: AsyncGenerator[Event, None]) -> web.StreamResponse:
    """Render `events` as SSE. The stream's end (aiohttp's write_eof) follows once the handler has
    returned, so the request's telemetry is recorded before the client sees the stream end."""
    writer = SseWriter(request, answer_headers(caller))
    renderer = api.renderer(plan)
    finished: Finished | None = None
    try:
        async with aclosing(events) as running:
            async for event in running:
                finished = await _shown(writer, renderer, event) or finished
        if finished is not None and finished.limit_reached:
            await writer.comment(f"toolspan: round limit reached after {finished.rounds} model turns")
        if renderer.closing:
            await writer.write(renderer.closing)
    except ClientGone:
        return reported(writer.response, caller, finished, "client_disconnected")
    except Exception as exc:
        if not writer.started:
            raise  # nothing sent yet: an ordinary error response
        # The 200 and part of the answer are out: the failure can only be an event in the stream.
        error = exc if isinstance(exc, GatewayError) else internal_error()
        if not isinstance(exc, GatewayError):
            log.exception("stream failed after it began")
        log_provider_failure(error, request.method, request.path, request[TRACE].trace_id)
        with contextlib.suppress(ClientGone):  # the client left as well; the spans say what went wrong
            await writer.frames([renderer.error(error)])
        return reported(writer.response, caller, finished, error.type)
    return reported(writer.response, caller, finished)


async def _shown(writer: SseWriter, renderer: StreamRenderer, event: Event) -> Finished | None:
    """One event written to the stream; the run's end, when it is that."""
    if isinstance(event, Opened):
        writer.provider_headers(event.headers)
    elif isinstance(event, Visible):
        await writer.frames(renderer.visible(event))
    elif isinstance(event, Keepalive):
        await writer.frames(renderer.waiting())
        await writer.comment("toolspan: running tools")
    elif isinstance(event, ToolsStarted):
        await writer.frames(renderer.started(event))
    elif isinstance(event, ToolsRan):
        await writer.frames(renderer.ran(event))
    else:
        await writer.frames(renderer.finished(event))
        return event
    return None


def reported(response: web.StreamResponse, caller: Caller, finished: Finished | None = None,
             error_type: str | None = None) -> web.StreamResponse:
    """`response`, carrying what telemetry records of this request."""
    rounds = finished.rounds if finished is not None else None
    limit = finished.limit_reached if finished is not None else False
    lost = finished.held_turn_lost if finished is not None else False
    response[RECORD] = RequestRecord(caller.trajectory_id, rounds, limit, error_type, held_turn_lost=lost,
                                     trajectory_source=caller.trajectory_source)
    return response


def json_answer(value: Any, headers: dict[str, str]) -> web.Response:
    """`value` as a JSON answer. orjson renders a large tool result several times faster than the
    stdlib, all of it holding the event loop; what orjson refuses (nesting past 254 levels,
    integers past 64 bits) the stdlib renders."""
    try:
        body = orjson.dumps(value)
    except orjson.JSONEncodeError:
        body = json.dumps(value).encode()
    return web.Response(body=body, content_type="application/json", headers=headers)


def answer_headers(caller: Caller, finished: Finished | None = None) -> dict[str, str]:
    """Headers of a tool-loop answer: its trajectory (the metadata may have named it) and rounds."""
    headers = {TRAJECTORY_HEADER: caller.trajectory_id}
    if finished is not None:
        headers[ROUNDS_HEADER] = str(finished.rounds)
        if finished.limit_reached:
            headers[ROUND_LIMIT_HEADER] = "reached"
    return headers


async def finished_of(events: AsyncIterator[Event]) -> Finished:
    """The last event of a non-streamed run (it has no other). The run is read to its end, so
    that it finishes here rather than in the event loop's clean-up of abandoned generators."""
    finished = None
    async for event in events:
        finished = event
    if not isinstance(finished, Finished):
        raise RuntimeError("the engine ended without a Finished event")
    return finished
