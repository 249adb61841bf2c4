"""Helpers every route uses: reading JSON bodies, knowing the caller, reporting back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, TypeVar

import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError

from gateway.app_keys import CALLER, RECORD
from gateway.caller import Caller
from gateway.engine import Event, Finished
from gateway.errors import BadRequest
from gateway.headers import TRAJECTORY_HEADER
from gateway.instrumentation import RequestRecord

ROUND_LIMIT_HEADER = "X-Toolspan-Round-Limit"
ROUNDS_HEADER = "X-Toolspan-Rounds"
M = TypeVar("M", bound=BaseModel)


async def read_object(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object, or a 400 saying what is wrong with it."""
    raw = await request.read()  # aiohttp enforces client_max_size here (413)
    try:
        body = orjson.loads(raw)  # the hot path: orjson is several times faster than json here
    except ValueError as exc:
        raise BadRequest(f"the request body is not valid JSON ({exc})", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object", code="invalid_json")
    return body


def validate(model: type[M], body: dict[str, Any], what: str) -> M:
    """`body` checked against the pydantic `model` of a request, or a 400 naming the field."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise BadRequest(f"not {what}: {where}: {first['msg']}",
                         param=str(first["loc"][0]) if first["loc"] else None) from exc


def caller_of(request: web.Request, metadata: object = None) -> Caller:
    """The request's caller, as the middleware resolved it and the request's metadata refines it."""
    return request[CALLER].with_metadata(metadata)


def reported(response: web.StreamResponse, caller: Caller, finished: Finished | None = None,
             error_type: str | None = None) -> web.StreamResponse:
    """`response`, carrying what telemetry records of this request."""
    rounds = finished.rounds if finished is not None else None
    limit = finished.limit_reached if finished is not None else False
    response[RECORD] = RequestRecord(caller.trajectory_id, rounds, limit, error_type)
    return response


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
