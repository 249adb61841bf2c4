"""GET /openapi.json: an OpenAPI 3.1 description of the gateway's own routes.

The provider's API passes through under /v1 and /openai unchanged; only what the gateway itself
answers is described here: the three model APIs it runs tools for, the tool routes, and the
operational endpoints. Bodies are described as loosely as the gateway reads them (extra fields
pass on to the provider), so the document is a fair input for a fuzzer such as Schemathesis.
"""

from __future__ import annotations

from typing import Any, get_args

from aiohttp import web

from gateway.http.keys import REGISTRY, SETTINGS
from gateway.limits.gate import LIMIT_ORDER
from gateway.limits.usage import AT_ONCE, UNITS
from gateway.tools.results import Status
from gateway.wire.headers import TRACE_HEADER, TRAJECTORY_HEADER


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _errors(shape: str = "Error") -> dict[str, Any]:
    return {"4XX": {"$ref": f"#/components/responses/{shape}"}, "5XX": {"$ref": f"#/components/responses/{shape}"}}


def _ids() -> list[Any]:
    return [{"$ref": "#/components/parameters/TrajectoryId"}]


def _shared_schemas() -> dict[str, Any]:
    """The schemas the document's parts share (built per document: nothing here is module state)."""
    return {
        "Error": {
            "type": "object", "required": ["error"],
            "properties": {"error": {
                "type": "object", "required": ["message", "type"],
                "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                               "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}},
        },
        "AnthropicError": {
            "type": "object", "required": ["type", "error"],
            "properties": {"type": {"const": "error"}, "error": {
                "type": "object", "required": ["type", "message"],
                "properties": {"type": {"type": "string"}, "message": {"type": "string"}}}},
        },
        "MessagesRequest": {
            "type": "object", "required": ["model", "messages", "max_tokens"],
            "properties": {
                "model": {"type": "string", "minLength": 1},
                "max_tokens": {"type": "integer", "minimum": 1},
                "messages": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "required": ["role", "content"],
                    "properties": {"role": {"enum": ["user", "assistant"]},
                                   "content": {"anyOf": [{"type": "string"},
                                                         {"type": "array", "items": {"type": "object"}}]}}}},
                "system": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
                "tools": {"type": "array", "items": {"type": "object", "required": ["name"],
                                                     "properties": {"name": {"type": "string", "minLength": 1}}},
                          "description": "The caller's own tools and the provider's, beside the gateway's."},
                "tool_choice": {"type": "object"},
                "stream": {"type": "boolean"},
                "metadata": {"type": "object"},
            },
        },
        "Message": {
            "type": "object", "required": ["type", "content"],
            "properties": {"id": {"type": "string"}, "type": {"const": "message"}, "role": {"const": "assistant"},
                           "model": {"type": "string"}, "content": {"type": "array"},
                           "stop_reason": {"type": ["string", "null"]}, "usage": {"type": "object"}},
        },
        "Metadata": {"type": "object", "maxProperties": 16,
                     "additionalProperties": {"type": "string", "maxLength": 512},
                     "description": "Key-value pairs; `trajectory_id` names the trajectory and is not sent on."},
        "FunctionTool": {
            "type": "object", "required": ["type", "function"],
            "properties": {"type": {"const": "function"}, "function": {
                "type": "object", "required": ["name"],
                "properties": {"name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                               "description": {"type": "string"}, "parameters": {"type": "object"},
                               "strict": {"type": ["boolean", "null"]}}}},
        },
        "ChatMessage": {
            "type": "object", "required": ["role"],
            "properties": {
                "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
                "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}},
                                      {"type": "null"}]},
                "name": {"type": "string"},
                "tool_call_id": {"type": "string"},
                "tool_calls": {"type": "array", "items": {"type": "object"}},
            },
        },
        "ChatRequest": {
            "type": "object", "required": ["model", "messages"],
            "properties": {
                "model": {"type": "string", "minLength": 1},
                "messages": {"type": "array", "minItems": 1, "items": _ref("ChatMessage")},
                "tools": {"type": "array", "items": _ref("FunctionTool"),
                          "description": "The caller's own tools, offered beside the gateway's and handed back."},
                "tool_choice": {"anyOf": [{"enum": ["none", "auto", "required"]}, {"type": "object"}]},
                "stream": {"type": "boolean"},
                "stream_options": {"type": "object"},
                "metadata": _ref("Metadata"),
            },
        },
        "ChatCompletion": {
            "type": "object", "required": ["object", "choices"],
            "properties": {"id": {"type": "string"}, "object": {"const": "chat.completion"},
                           "model": {"type": "string"}, "choices": {"type": "array"}, "usage": {"type": "object"}},
        },
        "ResponsesRequest": {
            "type": "object", "required": ["model"],
            "properties": {
                "model": {"type": "string", "minLength": 1},
                "input": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
                "instructions": {"type": ["string", "null"]},
                "tools": {"type": "array", "items": {"type": "object"}},
                "previous_response_id": {"type": ["string", "null"]},
                "store": {"type": ["boolean", "null"]},
                "stream": {"type": "boolean"},
                "metadata": _ref("Metadata"),
            },
        },
        "Response": {
            "type": "object", "required": ["object", "output"],
            "properties": {"id": {"type": "string"}, "object": {"const": "response"}, "status": {"type": "string"},
                           "output": {"type": "array"}},
        },
        "ToolRequest": {
            "type": "object",
            "properties": {"arguments": {
                "anyOf": [{"type": "object"}, {"type": "string"}],
                "description": "The arguments as a model would send them (object or JSON text)."},
                           "metadata": _ref("Metadata")},
        },
        "ToolOutcome": {
            "type": "object", "required": ["tool_call_id", "tool", "status", "content"],
            "properties": {"tool_call_id": {"type": "string"}, "tool": {"type": "string"},
                           "status": {"enum": list(get_args(Status))},
                           "content": {}, "processed_content": {}, "display_text": {"type": ["string", "null"]},
                           "error_type": {"type": ["string", "null"]}, "rejection": {"type": "object"},
                           "arguments_check": {"type": "object"}, "interrupt_data": {}},
        },
        "Parsed": {"type": "object", "required": ["valid"],
                   "properties": {"valid": {"type": "boolean"}, "arguments": {"type": "object"},
                                  "reason": {"type": "string"}, "message": {"type": "string"}}},
        "ToolList": {"type": "object", "required": ["object", "data"],
                     "properties": {"object": {"const": "list"},
                                    "data": {"type": "array", "items": _ref("FunctionTool")}}},
        "Status": {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}},
        **_limit_schemas(),
    }


def _limit_schemas() -> dict[str, Any]:
    """GET /v1/limits' answer (gateway.limits.usage)."""
    seconds = {"type": ["number", "null"], "minimum": 0}
    return {
        "LimitUsage": {
            "type": "object",
            "required": ["limit", "window", "unit", "bound", "used", "remaining", "resets_in_seconds", "resets_at"],
            "properties": {"limit": {"enum": list(LIMIT_ORDER)},
                           "window": {"enum": ["minute", "day", "month", AT_ONCE]},
                           "unit": {"enum": sorted(set(UNITS.values()))},
                           "bound": {"type": "number", "minimum": 0}, "used": {"type": "number", "minimum": 0},
                           "remaining": {"type": "number", "minimum": 0},
                           "resets_in_seconds": {**seconds, "description": "Until the window holds nothing it "
                                                                           "holds now; null for requests at once."},
                           "resets_at": {**seconds, "description": "The same, as Unix time."}}},
        "KeyLimits": {
            "type": "object", "required": ["object", "key", "max_rounds", "limits"],
            "properties": {"object": {"const": "key_limits"},
                           "key": {"type": ["string", "null"], "description": "The gateway key's name; null "
                                                                              "without keys."},
                           "max_rounds": {"type": ["integer", "null"], "minimum": 1},
                           "limits": {"type": "array", "items": _ref("LimitUsage")}}},
        "LimitList": {"type": "object", "required": ["object", "data"],
                      "properties": {"object": {"const": "list"}, "data": {"type": "array",
                                                                          "items": _ref("KeyLimits")}}},
    }


def _operation(summary: str, body: str | None, answer: dict[str, Any], *, parameters: list[Any] | None = None,
               errors: str = "Error") -> dict[str, Any]:
    operation: dict[str, Any] = {"summary": summary, "parameters": _ids() if parameters is None else parameters,
                                 "responses": {"200": {"description": "OK", "content": answer}, **_errors(errors)}}
    if body is not None:
        operation["requestBody"] = {"required": True, "content": _json(_ref(body))}
        # A body of any other type than JSON is refused unread (unsupported_media_type).
        operation["responses"]["415"] = {"$ref": f"#/components/responses/{errors}"}
    return operation


def document(tool_names: list[str]) -> dict[str, Any]:
    """The OpenAPI document, as a JSON-ready dict, naming the tools registered now."""
    # Each server-sent event, as OpenAPI 3.2 models one: `data` is a JSON chunk or event, or [DONE].
    event = {"type": "object", "required": ["data"],
             "properties": {"event": {"type": "string"}, "data": {"type": "string"}}}
    events = {"text/event-stream": {"schema": event}}
    chat = _operation("Chat Completions, with the gateway's tools run in the loop", "ChatRequest",
                      {**_json(_ref("ChatCompletion")), **events})
    responses = _operation("Responses, with the gateway's tools run in the loop", "ResponsesRequest",
                           {**_json(_ref("Response")), **events})
    messages = _operation("Anthropic's Messages, with the gateway's tools run in the loop", "MessagesRequest",
                          {**_json(_ref("Message")), **events}, errors="AnthropicError")
    tool_name = {"name": "name", "in": "path", "required": True, "description": "A registered tool's name.",
                 "schema": {"enum": tool_names} if tool_names else {"type": "string", "minLength": 1}}
    tool_parameters = [tool_name, *_ids()]
    plain = {"text/plain": {"schema": {"type": "string"}},
             "application/openmetrics-text": {"schema": {"type": "string"}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "toolspan", "version": "1",
                 "description": "The gateway's own routes. Every other path under /v1 and /openai is passed "
                                "to the provider as it is. Errors are OpenAI-shaped, but on /v1/messages "
                                "(Anthropic's shape)."},
        "security": [{}, {"gatewayKey": []}],
        "paths": {
            "/v1/chat/completions": {"post": chat},
            "/v1/responses": {"post": responses},
            "/v1/messages": {"post": messages},
            "/v1/tools": {"get": _operation("The tools this caller may use", None, _json(_ref("ToolList")))},
            "/v1/tools/{name}/invoke": {"post": _operation("Parse and execute one call of a tool", "ToolRequest",
                                                           _json(_ref("ToolOutcome")), parameters=tool_parameters)},
            "/v1/tools/{name}/parse": {"post": _operation("Parse only: what the tool would receive", "ToolRequest",
                                                          _json(_ref("Parsed")), parameters=tool_parameters)},
            "/v1/limits": {"get": _operation("This key's limits and what it has used of them (every key's, "
                                             "for the operator's key)", None, _json(_ref("LimitList")))},
            "/metrics": {"get": _operation("Prometheus metrics (OpenMetrics when asked)", None, plain,
                                           parameters=[])},
            "/healthz": {"get": _operation("Liveness", None, _json(_ref("Status")), parameters=[])},
            "/readyz": {"get": _operation("Readiness: started, and the provider reachable", None,
                                          _json(_ref("Status")), parameters=[])},
            "/openapi.json": {"get": _operation("This document", None, _json({"type": "object"}), parameters=[])},
        },
        "components": {
            "schemas": _shared_schemas(),
            "parameters": {"TrajectoryId": {
                "name": TRAJECTORY_HEADER, "in": "header", "required": False,
                "description": "Names the trajectory this request belongs to; a fresh one when absent.",
                "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"}}},
            "responses": {"Error": {
                "description": "An OpenAI-shaped error",
                "headers": {TRAJECTORY_HEADER: {"schema": {"type": "string"}},
                            TRACE_HEADER: {"schema": {"type": "string"}}},
                "content": _json(_ref("Error"))},
                "AnthropicError": {
                    "description": "An error in Anthropic's shape (the Messages API's routes)",
                    "headers": {TRAJECTORY_HEADER: {"schema": {"type": "string"}},
                                TRACE_HEADER: {"schema": {"type": "string"}}},
                    "content": _json(_ref("AnthropicError"))}},
            "securitySchemes": {"gatewayKey": {"type": "http", "scheme": "bearer",
                                               "description": "A gateway key, when the operator set keys."}},
        },
    }


async def openapi(request: web.Request) -> web.Response:
    """The document; with gateway keys set, it names no tools (which tools a key may use is for
    that key's GET /v1/tools to say)."""
    names = [] if request.app[SETTINGS].keys else sorted(request.app[REGISTRY].offered_names())
    return web.json_response(document(names))
