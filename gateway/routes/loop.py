"""The tool loop's routes (POST /v1/chat/completions, /v1/responses, /v1/messages), one handler for
every wire API: the request read and checked by the API's adapter, its trajectory found, the
results of the client's calls reported, the plan run and the answer rendered in the API's shape."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gateway.apis import unserved
from gateway.apis.base import WireApi
from gateway.caller import Caller
from gateway.client_tools import results as client_results
from gateway.engine import Plan
from gateway.engine.plan import Offering
from gateway.http.keys import INSTRUMENTATION, REGISTRY, SETTINGS, STATE, UPSTREAM
from gateway.routes import linking, render
from gateway.routes.common import caller_of, read_object

# What an API's route adds around the run (the Responses API keeps the answers it names by its own ids).
Keeping = Callable[[web.Request, Caller, Plan, dict[str, Any]], render.Around | None]
# What an API's route makes of the body first (a Messages thread: the conversation it continues, put back).
Opening = Callable[[web.Request, dict[str, Any]], Awaitable[dict[str, Any]]]


async def run_loop(request: web.Request, api: WireApi, keeping: Keeping | None = None,
                   opening: Opening | None = None) -> web.StreamResponse:
    """Answer one tool-loop request of `api`; at once, an API the upstream does not serve."""
    if (refusal := unserved(request.app[UPSTREAM].kind, api.name)) is not None:
        raise refusal
    body = await read_object(request)
    if opening is not None:
        body = await opening(request, body)
    asked = api.checked(body, request.match_info)
    held = request.app[STATE]
    caller = await linking.joined(caller_of(request, asked.metadata), held, asked.call_ids,
                                  asked.previous_response_id)
    settings = request.app[SETTINGS]
    if caller.client_check(settings.client_tool_check) != "off":
        await client_results.report_results(held, request.app[INSTRUMENTATION], caller, asked.results,
                                            settings.client_tool_error_prefix)
    registry = request.app[REGISTRY]
    # Hand-back mode: a client may declare a gateway tool (one that pauses for a reviewer, declared
    # approval=True or raising Interrupt), to receive its paused calls.
    shared = registry.offered_names(caller.allowed) if settings.interrupt_mode == "hand_back" else frozenset()
    plan = await api.plan(body, caller, registry, held, caller.provider_query(request.query_string), request.path,
                          Offering(settings.offer_tools_on_empty_tools, shared))
    around = keeping(request, caller, plan, body) if keeping is not None else None
    return await render.answer(request, caller, api, plan, around)


def handler(api: WireApi, keeping: Keeping | None = None) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The route handler of `api`."""
    async def handle(request: web.Request) -> web.StreamResponse:
        return await run_loop(request, api, keeping)

    handle.__doc__ = f"POST, the tool loop in the {api.name} API."
    return handle
