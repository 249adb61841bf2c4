"""/v1/approvals: the pending approvals of tool calls, and their decisions (gateway.tools.approval_gate).

GET /v1/approvals lists the caller's pending approvals (every key's, for the operator's key, or
without keys); GET /v1/approvals/{id} shows one; POST /v1/approvals/{id} decides it:
`{"decision": "approve" | "deny", "reason": "...", "output": ..., "arguments_sha256": "..."}`, where
`output` (any JSON) is the call's result when the call waits because its body raised Interrupt, and
`arguments_sha256` (optional) is the approval's as it was shown: a decision naming other arguments
is a 409 `arguments_changed`, and the approval stays pending."""

from __future__ import annotations

from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from gateway.apis.fields import validate
from gateway.http.bodies import EXPECT, read_object
from gateway.http.keys import APPROVALS, CALLER, SETTINGS
from gateway.routes.render import json_answer
from gateway.settings.parts import GatewayKey
from gateway.tools.approval_gate import Viewer

REASON_MAX = 2000  # characters of a decision's reason, here and on the page (routes.ui_approvals)
DIGEST_PATTERN = "^[0-9a-f]{64}$"  # an arguments_sha256: SHA-256 in lower-case hex


class Decision(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    decision: Literal["approve", "deny"]
    reason: str | None = Field(None, max_length=REASON_MAX)
    output: Any = None
    arguments_sha256: str | None = Field(None, pattern=DIGEST_PATTERN)


def viewer(principal: str | None, keys: dict[str, GatewayKey]) -> Viewer:
    """Who asks: without keys, anyone sees and decides everything (a gateway of one user)."""
    key = keys.get(principal) if principal is not None else None
    if key is None:
        return Viewer(principal, sees_all=not keys, may_decide=not keys)
    return Viewer(principal, sees_all=key.operator, may_decide=key.operator or key.approver)


def _viewer(request: web.Request) -> Viewer:
    return viewer(request[CALLER].principal, request.app[SETTINGS].keys)


async def list_approvals(request: web.Request) -> web.Response:
    """GET /v1/approvals."""
    listed = await request.app[APPROVALS].pending(_viewer(request))
    return json_answer({"object": "list", "data": listed}, {})


async def get_approval(request: web.Request) -> web.Response:
    """GET /v1/approvals/{id}."""
    return json_answer(await request.app[APPROVALS].one(request.match_info["id"], _viewer(request)), {})


async def decide_approval(request: web.Request) -> web.Response:
    """POST /v1/approvals/{id}."""
    body = await read_object(request)
    decision = validate(Decision, body, "a decision")
    decided = await request.app[APPROVALS].decide(request.match_info["id"], _viewer(request), decision.decision,
                                                  reason=decision.reason, output=decision.output,
                                                  has_output="output" in body,
                                                  arguments_sha256=decision.arguments_sha256)
    return json_answer(decided, {})


def mount(app: web.Application) -> None:
    app.router.add_get("/v1/approvals", list_approvals, **EXPECT)
    app.router.add_get("/v1/approvals/{id}", get_approval, **EXPECT)
    app.router.add_post("/v1/approvals/{id}", decide_approval, **EXPECT)
