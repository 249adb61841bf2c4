"""A Chat Completions request: the fields the gateway relies on, checked, and the request as a plan."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from gateway.apis.chat.history import ChatConversation, held_tokens, names_gateway_calls, restore_messages
from gateway.apis.fields import JsonObjects, NonEmptyJsonObjects, checked_first_by
from gateway.caller import Caller
from gateway.client_tools.results import LATEST_RESULTS
from gateway.engine.plan import NO_OPTIONS, Offering, Plan, Wire, check_clash, offers_tools, upstream_base
from gateway.errors import BadRequest
from gateway.guardrails.client import ResultPlace
from gateway.linking import LATEST_CALLS
from gateway.state import NOTHING, StateStore
from gateway.tools import Tool, ToolRegistry


class _Function(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    name: str = Field(min_length=1)


class _ToolSpec(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: str
    function: _Function | None = None  # tools of other types (custom, ...) are the provider's business


def tool_specs_pass(value: Any) -> bool:
    """What list[_ToolSpec] takes, for the lists most clients send (orjson's dicts and strings)."""
    return type(value) is list and all(
        type(spec) is dict and type(spec.get("type")) is str
        and ((function := spec.get("function")) is None
             or (type(function) is dict and type(name := function.get("name")) is str and name != ""))
        for spec in value)


ToolSpecs = Annotated[list[dict[str, Any]], checked_first_by(tool_specs_pass, TypeAdapter(list[_ToolSpec]))]


class ChatRequest(BaseModel):
    """The fields the gateway relies on; everything else goes to the provider untouched. Strict
    types, as OpenAI's API has them: `"stream": "true"` or `"n": 1.0` is refused, not coerced."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str = Field(min_length=1)
    messages: NonEmptyJsonObjects
    tools: ToolSpecs | None = None
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    n: int | None = Field(None, ge=1)
    metadata: dict[str, Any] | None = None
    functions: JsonObjects | None = None  # the legacy form of tools


def tool_spec(tool: Tool) -> dict[str, Any]:
    """A gateway tool as Chat Completions declares a tool."""
    function: dict[str, Any] = {"name": tool.name, "description": tool.description, "parameters": tool.schema}
    if tool.strict:
        function["strict"] = True
    return {"type": "function", "function": function}


def tool_name(spec: Any) -> str | None:
    """The name of a declared tool: a function's, or a custom tool's."""
    if not isinstance(spec, Mapping):
        return None
    inner = spec.get("function") if spec.get("type", "function") == "function" else spec.get(str(spec.get("type")))
    name = inner.get("name") if isinstance(inner, Mapping) else None
    return name if isinstance(name, str) and name else None


def call_ids(messages: Sequence[Any]) -> list[str]:
    """Ids of the calls a Chat conversation answers or repeats, the latest first."""
    found: list[str] = []
    for message in reversed(messages):
        if len(found) >= LATEST_CALLS:
            break
        if not isinstance(message, Mapping):
            continue
        if isinstance(answered := message.get("tool_call_id"), str):
            found.append(answered)
        calls = message.get("tool_calls")
        for call in reversed(calls) if isinstance(calls, list) else ():
            if isinstance(call, Mapping) and isinstance(call_id := call.get("id"), str):
                found.append(call_id)
    return list(dict.fromkeys(found))


def results(messages: Sequence[Any]) -> list[tuple[str, Any, bool | None]]:
    """(call id, content, error flag: none in Chat) of the latest `tool` messages of a conversation:
    those after its last assistant message, the latest first."""
    found: list[tuple[str, Any, bool | None]] = []
    for message in reversed(messages):
        if len(found) >= LATEST_RESULTS or (isinstance(message, Mapping) and message.get("role") == "assistant"):
            break
        if (isinstance(message, Mapping) and message.get("role") == "tool"
                and isinstance(call_id := message.get("tool_call_id"), str)):
            found.append((call_id, message.get("content"), None))
    return found


def result_places(messages: object) -> list[ResultPlace]:
    """Where every `tool` message of a conversation holds its result, with its call's tool and
    arguments where an assistant message before it has the call."""
    calls: dict[str, tuple[str | None, object]] = {}
    places: list[ResultPlace] = []
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role == "assistant" and isinstance(made := message.get("tool_calls"), list):
            for call in made:
                if not isinstance(call, dict) or not isinstance(call_id := call.get("id"), str):
                    continue
                inner = call.get("function") or call.get("custom")  # a function's call, or a custom tool's
                if isinstance(inner, dict):
                    name = inner.get("name")
                    calls[call_id] = (name if isinstance(name, str) else None, inner.get("arguments"))
        elif role == "tool" and isinstance(call_id := message.get("tool_call_id"), str):
            tool, arguments = calls.get(call_id, (None, None))
            places.append(ResultPlace(call_id, message, "content", "text", tool, arguments))
    return places


async def plan_chat(api: Wire, body: Mapping[str, Any], caller: Caller, registry: ToolRegistry, held: StateStore,
                    query: str = "", path: str = "", offer: Offering = NO_OPTIONS) -> Plan:
    """A Chat Completions request (checked) as a plan."""
    offers = offers_tools(body, offer.on_empty)
    gateway_names = registry.offered_names(caller.allowed) if offers else frozenset()
    offered = registry.specs("chat", tool_spec, caller.allowed) if offers else []
    base, client_names = upstream_base(body, ("messages", "stream", "stream_options"), tool_name,
                                       offered, gateway_names,
                                       offer.shared)
    legacy = frozenset(f["name"] for f in body.get("functions") or [] if isinstance(f, dict)
                       and isinstance(f.get("name"), str))
    check_clash(legacy, gateway_names, "functions")
    if gateway_names and (body.get("n") or 1) != 1:
        raise BadRequest("n must be 1 when the gateway offers tools", param="n")
    messages = body["messages"]
    tokens = held_tokens(messages)
    found = await held.lookup(caller.principal, tokens) if tokens else NOTHING
    if tokens or names_gateway_calls(messages):
        messages = restore_messages(messages, partial(found.take, api="chat"))
    options = body.get("stream_options")
    options = options if isinstance(options, Mapping) else {}
    conversation = ChatConversation(base, tuple(messages), (), options)
    include_usage = bool(options.get("include_usage"))
    lost = any(found.take(token, "chat") is None for token in tokens)
    return Plan(api, str(body["model"]), bool(body.get("stream")), conversation, client_names | legacy,
                gateway_names, include_usage=include_usage, query=query, path=path, held_turn_lost=lost,
                client_tools=body.get("tools") or ())
