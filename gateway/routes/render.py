"""Answering with a plan's run: the engine's events as one JSON body, or as server-sent events
through the API's stream renderer. Every API's tool-loop route ends here."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping
from contextlib import aclosing

import aiohttp
import orjson
from aiohttp import web

from gateway.apis.base import Frame, WireApi
from gateway.caller import Caller
from gateway.client_tools import results as client_results
from gateway.engine import Event, Finished, Keepalive, Opened, Plan, Visible
from gateway.errors import GatewayError, internal_error, log_provider_failure
from gateway.http.keys import ENGINE, SETTINGS, STATE, TRACE
from gateway.routes import linking
from gateway.routes.common import answer_headers, finished_of, reported

log = logging.getLogger("toolspan")

Around = Callable[[AsyncGenerator[Event, None]], AsyncGenerator[Event, None]]


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
                 around: Around | None = None) -> web.StreamResponse:
    """Run `plan` (of `api`) and answer: with the API's JSON answer, or, for a streamed request, as
    its events. `around` sees the events first (an API's own bookkeeping before the client sees the end)."""
    events = request.app[ENGINE].run(plan, caller)
    if around is not None:
        events = around(events)
    if plan.stream:
        return await stream(request, caller, api, plan, events)
    finished = await finished_of(events)
    await _link(request, caller, api, finished)
    headers = {**finished.turns[-1].headers, **answer_headers(caller, finished)}
    body = orjson.dumps(api.as_json(plan, finished))
    response = web.Response(body=body, content_type="application/json", headers=headers)
    return reported(response, caller, finished)


async def _link(request: web.Request, caller: Caller, api: WireApi, finished: Finished) -> None:
    """The answer's call and response ids, linked to the caller's trajectory (gateway.routes.linking)."""
    # Only an id a later request can continue from (Responses') links.
    response_id = finished.response_id if api.continues_by_id else None
    handed = [found for call in finished.client_calls if (found := api.handed(call)) is not None]
    await linking.remember(request.app[STATE], caller, [call_id for call_id, _ in handed], response_id)
    if handed and caller.client_check(request.app[SETTINGS].client_tool_check) != "off":
        await client_results.keep_handed(request.app[STATE], caller, handed)


async def stream(request: web.Request, caller: Caller, api: WireApi, plan: Plan,  # noqa: C901
                 events: AsyncGenerator[Event, None]) -> web.StreamResponse:
    """Render `events` as SSE. The stream's end (aiohttp's write_eof) follows once the handler has
    returned, so the request's telemetry is recorded before the client sees the stream end."""
    writer = SseWriter(request, answer_headers(caller))
    renderer = api.renderer(plan)
    finished: Finished | None = None
    try:
        async with aclosing(events) as running:
            async for event in running:
                if isinstance(event, Opened):
                    writer.provider_headers(event.headers)
                elif isinstance(event, Visible):
                    await writer.frames(renderer.visible(event))
                elif isinstance(event, Keepalive):
                    await writer.frames(renderer.waiting())
                    await writer.comment("toolspan: running tools")
                else:
                    finished = event
                    await _link(request, caller, api, event)  # before the client can continue from it
                    await writer.frames(renderer.finished(event))
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
