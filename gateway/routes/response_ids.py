"""GET, input_items, DELETE and cancel of a response id the gateway made (resp_tspan_..., or a
streamed answer's first provider id that the gateway continued past). The provider knows none of
these answers as the client does: GET answers the response the client was given, input_items the
input the client sent, DELETE deletes every provider response behind it and forgets the id. Each
per gateway key: another key's id is a 404, as one that does not exist. Any other id passes
through to the provider as before (gateway.routes.passthrough)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from gateway.apis.responses.records import AnswerRecord, page
from gateway.errors import BadRequest, GatewayError, NotFound, UpstreamUnavailable
from gateway.http.bodies import EXPECT
from gateway.http.keys import CALLER, STATE, TRACE
from gateway.provider.client import Upstream
from gateway.routes.passthrough import check_route, holder, passthrough
from gateway.routes.provider_errors import provider_error
from gateway.routes.render import json_answer
from gateway.state import RESPONSE_PREFIX, StateUnavailable, no_such_response

ID = "response_id"  # the route's match_info name
PATHS = ("/v1/responses/{response_id}", "/openai/responses/{response_id}", "/openai/v1/responses/{response_id}")


@dataclass(frozen=True)
class _Held:
    response_id: str
    record: AnswerRecord


async def _held(request: web.Request) -> _Held | None:
    """What the gateway holds of the id the request names, for the caller's key; None: an id of
    the provider's, to pass through. A gateway-made id it does not hold is a 404."""
    check_route(request)
    response_id, principal = request.match_info[ID], request[CALLER].principal
    state = request.app[STATE]
    try:
        text = (await state.answers.get(principal, [response_id])).get(response_id)
    except StateUnavailable:
        if response_id.startswith(RESPONSE_PREFIX):
            raise
        return None  # the provider's id, as before: what it answers is only short of the gateway's rounds
    record = AnswerRecord.load(text) if text is not None else None
    if record is not None:
        return _Held(response_id, record)
    if not response_id.startswith(RESPONSE_PREFIX):
        return None
    found = await state.lookup(principal, (), (), response_id)
    if found.response is None:
        raise no_such_response(response_id)
    return _Held(response_id, AnswerRecord((found.response,)))  # an alias kept without its record


def _provider_path(request: web.Request, upstream: Upstream, response_id: str, suffix: str = "") -> str:
    """The provider's path for one of the responses behind the answer, on the surface the caller addressed."""
    prefix = request.path[:request.path.index("/responses/") + len("/responses/")]
    query = request[CALLER].provider_query(request.query_string)
    path = upstream.forward_path(f"{prefix}{response_id}{suffix}" + (f"?{query}" if query else ""))
    if path is None:
        raise NotFound(f"no such route for this provider: {request.path}", code="invalid_path")
    return path


async def _ask(request: web.Request, method: str, response_id: str, suffix: str = "") -> aiohttp.ClientResponse:
    """A call about one provider response, to the upstream that holds it."""
    upstream = await holder(request, response_id)
    path = _provider_path(request, upstream, response_id, suffix)
    headers = upstream.headers(request[CALLER].upstream_headers)
    request[TRACE].inject(headers)
    return await upstream.forward(method, path, headers, None)


async def _provider_json(request: web.Request, response_id: str, suffix: str = "") -> dict[str, Any]:
    """A provider GET's JSON object; its error, OpenAI-shaped, as the pass-through gives it."""
    answer = await _ask(request, "GET", response_id, suffix)
    try:
        if answer.status >= 400:
            raise _Answered(await provider_error(answer))
        body = await answer.read()
    finally:
        answer.release()
    try:
        decoded = orjson.loads(body)
    except ValueError:
        decoded = None
    if not isinstance(decoded, dict):
        raise UpstreamUnavailable("the provider sent a response that is not a JSON object")
    return decoded


class _Answered(Exception):
    """The provider's OpenAI-shaped refusal, to answer as it came."""

    def __init__(self, response: web.Response) -> None:
        super().__init__("answered")
        self.response = response


async def retrieve(request: web.Request) -> web.StreamResponse:
    """GET /v1/responses/{id}: the response the client was given. Kept too large, the provider's
    last response behind it, under the client's id."""
    held = await _held(request)
    if held is None:
        return await passthrough(request)
    if request.query.get("stream", "").lower() == "true":
        raise BadRequest("this response was assembled by the gateway and cannot be streamed again; retrieve it "
                         "without stream", param="stream", code="stream_not_supported")
    if held.record.response is not None:
        return json_answer(held.record.response, {})
    if not held.record.rounds:
        raise no_such_response(held.response_id)
    try:
        last = await _provider_json(request, held.record.rounds[-1])
    except _Answered as answered:
        return answered.response
    return json_answer({**last, "id": held.response_id}, {})


async def input_items(request: web.Request) -> web.StreamResponse:
    """GET /v1/responses/{id}/input_items: the input the client sent, a page at a time. Kept too
    large, the provider's input items of the first round (the same input, as the provider listed it)."""
    held = await _held(request)
    if held is None:
        return await passthrough(request)
    if held.record.input is not None:
        return json_answer(page(held.record.input, request.query), {})
    if not held.record.rounds:
        raise no_such_response(held.response_id)
    try:
        listed = await _provider_json(request, held.record.rounds[0], "/input_items")
    except _Answered as answered:
        return answered.response
    return json_answer(listed, {})


async def _delete_one(request: web.Request, response_id: str) -> int | None:
    """Delete one provider response; None when it is gone (deleted now, or before: a 404), else
    the status the provider answered."""
    try:
        answer = await _ask(request, "DELETE", response_id)
    except GatewayError as exc:
        return exc.status
    try:
        await answer.read()
    except (aiohttp.ClientError, TimeoutError):
        return 502
    finally:
        answer.release()
    return None if answer.status < 300 or answer.status == 404 else answer.status


async def delete(request: web.Request) -> web.StreamResponse:
    """DELETE /v1/responses/{id}: every provider response behind the answer, then the id. When the
    provider fails to delete one, the id is kept, so that deleting it again finishes the job."""
    held = await _held(request)
    if held is None:
        return await passthrough(request)
    statuses = await asyncio.gather(*(_delete_one(request, r) for r in held.record.rounds))
    failed = [(r, s) for r, s in zip(held.record.rounds, statuses, strict=True) if s is not None]
    if failed:
        said = ", ".join(f"{status}" for _, status in failed)
        raise UpstreamUnavailable(f"the provider did not delete {len(failed)} of the {len(statuses)} responses "
                                  f"behind this one (it answered {said}); delete it again", code="delete_incomplete")
    state, forgotten = request.app[STATE], [held.response_id]  # its record and its alias, in one step
    await state.maps.delete(request[CALLER].principal, state.answers.at(forgotten), state.aliases.at(forgotten))
    return json_answer({"id": held.response_id, "object": "response", "deleted": True}, {})


async def cancel(request: web.Request) -> web.StreamResponse:
    """POST /v1/responses/{id}/cancel: an answer the gateway assembled ran while its client waited,
    never in the background: there is nothing to cancel."""
    held = await _held(request)
    if held is None:
        return await passthrough(request)
    raise BadRequest("this response was answered while the request waited (the gateway ran tools for it), not in "
                     "the background: only background responses can be cancelled", code="response_not_cancellable")


def mount(app: web.Application) -> None:
    """The routes, before the pass-through's catch-all."""
    for path in PATHS:
        app.router.add_get(path, retrieve, **EXPECT)
        app.router.add_delete(path, delete, **EXPECT)
        app.router.add_get(f"{path}/input_items", input_items, **EXPECT)
        app.router.add_post(f"{path}/cancel", cancel, **EXPECT)
