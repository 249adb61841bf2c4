"""GET /v1/models and /v1/models/{model}, mounted when the `upstreams` table names models: the
models this gateway routes (merged across its upstreams, those a key may use when its `models`
limit it), in OpenAI's list shape, or Anthropic's for an Anthropic client. With no model named
anywhere, these routes are the pass-through's: the default upstream's own list, as before."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.http.bodies import EXPECT
from gateway.http.keys import CALLER, UPSTREAMS
from gateway.routes import passthrough

EPOCH = "1970-01-01T00:00:00Z"  # Anthropic's list gives each model a creation time; the gateway knows none


def _entry(model: str, upstream: str, anthropic: bool) -> dict[str, Any]:
    if anthropic:
        return {"type": "model", "id": model, "display_name": model, "created_at": EPOCH}
    return {"id": model, "object": "model", "created": 0, "owned_by": upstream}


def _served(request: web.Request) -> dict[str, str]:
    """The models the caller may ask for by name, each with the upstream it goes to first."""
    upstreams = request.app[UPSTREAMS]
    allowed = request[CALLER].models
    return {model: upstreams.route(model).primary[0].upstream for model in upstreams.offered(allowed)}


async def list_models(request: web.Request) -> web.StreamResponse:
    """GET /v1/models."""
    passthrough.check_route(request)
    served = _served(request)
    anthropic = "anthropic-version" in request.headers
    data = [_entry(model, upstream, anthropic) for model, upstream in served.items()]
    if anthropic:
        ends = {"first_id": data[0]["id"], "last_id": data[-1]["id"]} if data else {"first_id": None, "last_id": None}
        return web.json_response({"data": data, "has_more": False, **ends})
    return web.json_response({"object": "list", "data": data})


async def retrieve_model(request: web.Request) -> web.StreamResponse:
    """GET /v1/models/{model}."""
    passthrough.check_route(request)
    model = request.match_info["model"]
    route = request.app[UPSTREAMS].route(model, request[CALLER].models)  # by pattern too; a 404 otherwise
    return web.json_response(_entry(model, route.primary[0].upstream, "anthropic-version" in request.headers))


def mount(app: web.Application) -> None:
    app.router.add_get("/v1/models", list_models, **EXPECT)
    app.router.add_get("/v1/models/{model:.+}", retrieve_model, **EXPECT)  # vLLM's names hold slashes
