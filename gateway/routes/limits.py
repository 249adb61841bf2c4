"""GET /v1/limits: the limits of the caller's gateway key and what it has used of each, now (every
key's for the operator's key; the one caller's without keys). For each limit: its bound, what the
current window holds, what is left and when the window holds none of it any more
(gateway.limits.usage). `toolspan keys usage` prints it."""

from __future__ import annotations

from aiohttp import web

from gateway.errors import Unavailable
from gateway.http.bodies import EXPECT
from gateway.http.keys import CALLER, LOOP, SETTINGS
from gateway.limits.usage import key_usage_json, usage_of, whose
from gateway.routes.render import json_answer
from gateway.state.base import StateUnavailable

PATH = "/v1/limits"


async def list_limits(request: web.Request) -> web.Response:
    """GET /v1/limits."""
    names = whose(request[CALLER].principal, request.app[SETTINGS].keys)
    try:
        found = await usage_of(request.app[LOOP].limiter, names)
    except StateUnavailable:
        raise Unavailable("the gateway cannot read the keys' counts now (its shared state is unreachable); "
                          "retry shortly", code="state_unavailable", retry_after=2) from None
    return json_answer({"object": "list", "data": [key_usage_json(entry) for entry in found]}, {})


def mount(app: web.Application) -> None:
    app.router.add_get(PATH, list_limits, **EXPECT)
