"""POST /v1/responses: the Responses API's tool loop (gateway.routes.loop), keeping what it answers
under ids of the gateway's own. The other /v1/responses routes (GET, DELETE, input_items, cancel)
pass through to the provider, but for those ids (gateway.routes.response_ids)."""

from __future__ import annotations

from functools import partial

from aiohttp import web

from gateway.apis.responses import RESPONSES
from gateway.apis.responses.render import final_response
from gateway.caller import Caller
from gateway.engine import Plan
from gateway.http.keys import SETTINGS, STATE
from gateway.routes import render
from gateway.routes.answer_records import remembered
from gateway.routes.loop import run_loop


def _kept(request: web.Request, caller: Caller, plan: Plan, body: dict[str, object]) -> render.Around:
    """An answer under an id of the gateway's is kept, for GET, input_items and DELETE of that id."""
    return partial(remembered, state=request.app[STATE], principal=caller.principal,
                   response_of=partial(final_response, plan), sent=body.get("input"),
                   stored=body.get("store") is not False, max_bytes=request.app[SETTINGS].answer_record_max_bytes)


async def create_response(request: web.Request) -> web.StreamResponse:
    """POST /v1/responses."""
    return await run_loop(request, RESPONSES, _kept)
