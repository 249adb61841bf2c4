"""The tool loop's routes (POST /v1/chat/completions, /v1/responses, /v1/messages and the Azure-style
paths), one handler for every wire API. A request walks down once: its body read, checked by the
API's adapter, its trajectory found, the results of the client's calls guarded (masked where the
guardrails say) and reported, the plan made; then the run's events pass the API's own bookkeeping
and the trajectory's links on their way to the answer, rendered in the API's shape."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway import linking
from gateway.apis.base import Keeping, WireApi
from gateway.apis.registry import unserved
from gateway.client_tools import results as client_results
from gateway.http.bodies import read_object
from gateway.http.keys import CALLER, LOOP
from gateway.routes import render
from gateway.routes.quota import within_limits


async def run_loop(request: web.Request, api: WireApi) -> web.StreamResponse:
    """Answer one tool-loop request of `api`."""
    parts, called = request.app[LOOP], request[CALLER]
    body = await api.opened(await read_object(request), parts.state, called.principal)
    asked = api.checked(body, request.match_info)
    caller = await linking.joined(called, parts.state, asked.call_ids, asked.previous_response_id, asked.metadata,
                                  asked.trajectory_id)
    # Every result of the client's tools in the body passes the guardrails before anything reads the
    # body's content (the plan, held turns, answer records, the provider); linking reads only ids.
    guards = parts.engine.client_results
    guarded = (await guards.guard(api.result_places(body), caller.principal, caller.trajectory_id)
               if guards is not None else None)
    settings = parts.settings
    plan = await api.plan(body, caller, parts.registry, parts.state, caller.provider_query(request.query_string),
                          request.path, parts.offering(caller))
    events = api.kept(parts.engine.run(plan, caller),
                      Keeping(plan, body, parts.state, caller.principal, settings.answer_record_max_bytes))
    checks_client = caller.client_check(settings.client_tool_check) != "off"
    events = linking.remembered(events, parts.state, caller, api, checks_client)
    if checks_client or guarded:  # what the client's own tools did with the calls an earlier answer handed it
        await client_results.report_results(parts.state, parts.instrumentation, caller, asked.results,
                                            settings.client_tool_error_prefix, guarded, look_up=checks_client)
    return await render.answer(request, caller, api, plan, events)


def handler(api: WireApi) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The route handler of `api`: at once, before its body is read, a refusal when the upstream
    does not serve the API."""
    async def handle(request: web.Request) -> web.StreamResponse:
        if (refusal := unserved(request.app[LOOP].upstreams, api.name)) is not None:
            raise refusal
        return await within_limits(request, lambda: run_loop(request, api))

    handle.__doc__ = f"POST, the tool loop in the {api.name} API."
    return handle
