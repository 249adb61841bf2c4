"""GET /v1/tools, POST /v1/tools/{name}/invoke, POST /v1/tools/{name}/parse."""

from __future__ import annotations

import json
import secrets
from typing import Any

import pydantic_core
from aiohttp import web

from gateway import linking
from gateway.apis.chat import CHAT
from gateway.caller import Caller
from gateway.errors import BadRequest, Forbidden, NotFound
from gateway.http.bodies import read_object
from gateway.http.keys import CALLER, EXECUTOR, REGISTRY
from gateway.routes.render import answer_headers, json_answer, reported
from gateway.tools import Rejection, Tool, ToolCall, ToolOutcome
from gateway.wire.headers import named_trajectory


def _jsonable(value: Any) -> Any:
    return pydantic_core.to_jsonable_python(value, fallback=repr)


def _arguments(body: dict[str, Any]) -> str:
    """The `arguments` field as the JSON text a model would have sent."""
    arguments = body.get("arguments", {})
    if isinstance(arguments, str):
        return arguments
    if isinstance(arguments, dict):
        return json.dumps(arguments)
    raise BadRequest("arguments must be a JSON object (or its JSON text)", param="arguments")


def _tool(request: web.Request, caller: Caller) -> Tool:
    name = request.match_info["name"]
    registry = request.app[REGISTRY]
    tool = registry.get(name)
    if tool is None or registry.on_request(name):  # a tool only a Responses request's declaration offers
        raise NotFound(f"there is no tool named '{name}'", param="name", code="unknown_tool")
    if caller.allowed is not None and name not in caller.allowed:
        raise Forbidden(f"tool '{name}' is not available to this caller", param="name", code="not_allowed")
    return tool


def outcome_json(outcome: ToolOutcome) -> dict[str, Any]:
    body: dict[str, Any] = {
        "tool_call_id": outcome.call_id, "tool": outcome.tool_name, "status": outcome.status,
        "content": outcome.content, "processed_content": _jsonable(outcome.processed_content),
        "display_text": outcome.display_text, "error_type": outcome.error_type,
    }
    if outcome.status == "interrupted":
        body["interrupt_data"] = _jsonable(outcome.interrupt_data)  # for the application, never the model
    if outcome.rejection is not None:
        body["rejection"] = {"reason": outcome.rejection.reason}
    if outcome.names is not None:
        body["arguments_check"] = {"missing": list(outcome.names.missing),
                                   "unrecognized": list(outcome.names.unrecognized),
                                   "suggestions": dict(outcome.names.suggestions),
                                   "accepted": list(outcome.names.accepted)}
    return body


async def list_tools(request: web.Request) -> web.Response:
    caller = request[CALLER]
    specs = request.app[REGISTRY].specs("chat", CHAT.tool_spec, caller.allowed)  # OpenAI's shape
    return web.json_response({"object": "list", "data": specs})


async def invoke(request: web.Request) -> web.StreamResponse:
    body = await read_object(request)
    caller = linking.described(request[CALLER], body.get("metadata"), named_trajectory(body.get("metadata")))
    tool = _tool(request, caller)
    call = ToolCall(f"call_{secrets.token_hex(12)}", tool.name, _arguments(body))
    outcome = await request.app[EXECUTOR].run_call(call, caller.turn(0), caller.allowed)
    return reported(json_answer(outcome_json(outcome), answer_headers(caller)), caller)


async def parse(request: web.Request) -> web.StreamResponse:
    """A dry run of the parse step: what the body would receive, or why it would not run."""
    body = await read_object(request)
    caller = linking.described(request[CALLER], body.get("metadata"), named_trajectory(body.get("metadata")))
    tool = _tool(request, caller)
    parsed = await tool.parse_arguments(_arguments(body), caller.turn(0).context("dry_run"))
    if isinstance(parsed, Rejection):
        answer = {"valid": False, "reason": parsed.reason, "message": parsed.message}
    else:
        answer = {"valid": True, "arguments": _jsonable(parsed.arguments)}
    return reported(web.json_response(answer, headers=answer_headers(caller)), caller)
