"""Helpers every route uses: reading JSON bodies and knowing the caller."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from gateway.errors import BadRequest
from gateway.keys import SCOPE, RequestScope
from gateway.loop import Caller


def scope(request: web.Request) -> RequestScope:
    found: RequestScope = request[SCOPE]
    return found


async def read_object(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object, or a 400 saying what is wrong with it."""
    raw = await request.read()  # aiohttp enforces client_max_size here (413)
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"the request body is not valid JSON ({exc})", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object", code="invalid_json")
    return body


def caller_of(request: web.Request, metadata: Any = None) -> Caller:
    found = scope(request)
    found.adopt_trajectory(metadata)
    return Caller(
        trajectory_id=found.trajectory_id,
        request_id=found.request_id,
        authorization=request.headers.get("Authorization"),
        metadata=metadata if isinstance(metadata, dict) else {},
    )
