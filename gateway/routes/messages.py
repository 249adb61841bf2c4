"""POST /v1/messages: the Messages API's tool loop (gateway.routes.loop), holding the threads its
clients keep (the beta `thread` field: gateway.apis.messages.threads)."""

from __future__ import annotations

from functools import partial
from typing import Any

from aiohttp import web

from gateway.apis.messages import MESSAGES, threads
from gateway.caller import Caller
from gateway.engine import Plan
from gateway.http.keys import CALLER, SETTINGS, STATE
from gateway.routes import render
from gateway.routes.loop import run_loop


async def _whole(request: web.Request, body: dict[str, Any]) -> dict[str, Any]:
    """A continued thread's request with its conversation put back."""
    if "thread" not in body:
        return body
    return await threads.whole(body, request.app[STATE], request[CALLER].principal)


def _kept(request: web.Request, caller: Caller, plan: Plan, body: dict[str, Any]) -> render.Around | None:
    """A threaded request's answer is kept with its conversation, for the thread's next turn."""
    if body.get("thread") is None:
        return None
    return partial(threads.kept, state=request.app[STATE], principal=caller.principal, body=body,
                   max_bytes=request.app[SETTINGS].answer_record_max_bytes)


async def create_message(request: web.Request) -> web.StreamResponse:
    """POST /v1/messages."""
    return await run_loop(request, MESSAGES, _kept, _whole)
