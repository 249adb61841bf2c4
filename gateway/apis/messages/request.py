"""An Anthropic Messages request: the fields the gateway relies on, checked, and the request as a plan."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from itertools import islice
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from gateway.apis.fields import NonEmptyJsonObjects, checked_first_by
from gateway.apis.messages.history import MessagesConversation, held_tokens, names_gateway_calls, restore_messages
from gateway.caller import Caller
from gateway.client_tools.results import LATEST_RESULTS
from gateway.engine.plan import NO_OPTIONS, Offering, Plan, Wire, offers_tools, upstream_base
from gateway.guardrails.client import ResultPlace
from gateway.linking import LATEST_CALLS
from gateway.state import NOTHING, StateStore
from gateway.tools import Tool, ToolRegistry


class _ToolSpec(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    name: str = Field(min_length=1)  # custom tools and the provider's own (web_search, bash ...) alike


def tool_specs_pass(value: Any) -> bool:
    """What list[_ToolSpec] takes, for the lists most clients send (orjson's dicts and strings)."""
    return type(value) is list and all(
        type(spec) is dict and type(name := spec.get("name")) is str and name != "" for spec in value)


ToolSpecs = Annotated[list[dict[str, Any]], checked_first_by(tool_specs_pass, TypeAdapter(list[_ToolSpec]))]


class MessagesRequest(BaseModel):
    """The fields the gateway relies on; everything else (max_tokens, system, thinking ...) goes to
    the provider untouched, for it to judge."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str = Field(min_length=1)
    messages: NonEmptyJsonObjects
    tools: ToolSpecs | None = None
    stream: bool | None = False
    metadata: dict[str, Any] | None = None


def tool_spec(tool: Tool) -> dict[str, Any]:
    """A gateway tool as the Messages API declares a tool."""
    return {"name": tool.name, "description": tool.description, "input_schema": tool.schema}


def tool_name(spec: Any) -> str | None:
    """The name of a declared tool, of any type: a client tool's name and a server tool's (web
    search, code execution ...) both name what the model may call."""
    name = spec.get("name") if isinstance(spec, Mapping) else None
    return name if isinstance(name, str) and name else None


def _latest_ids(messages: Sequence[Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(call id, block) of each call (`tool_use`) and result (`tool_result`) block, the latest first."""
    for message in reversed(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        for block in reversed(content) if isinstance(content, list) else ():
            if not isinstance(block, Mapping):
                continue
            key = {"tool_use": "id", "tool_result": "tool_use_id"}.get(str(block.get("type")))
            if key is not None and isinstance(call_id := block.get(key), str):
                yield call_id, block


def call_ids(messages: Sequence[Any]) -> list[str]:
    """Ids of the calls a conversation answers or repeats, the latest first."""
    return list(dict.fromkeys(call_id for call_id, _ in islice(_latest_ids(messages), LATEST_CALLS)))


def results(messages: Sequence[Any]) -> list[tuple[str, Any, bool | None]]:
    """(call id, content, is_error) of the latest `tool_result` blocks of a conversation: those after
    its last assistant message, the latest first."""
    found: list[tuple[str, Any, bool | None]] = []
    for message in reversed(messages):
        if not isinstance(message, Mapping):
            continue
        if message.get("role") == "assistant":
            break
        content = message.get("content")
        for block in reversed(content) if isinstance(content, list) else ():
            if (isinstance(block, Mapping) and block.get("type") == "tool_result"
                    and isinstance(call_id := block.get("tool_use_id"), str)):
                found.append((call_id, block.get("content"), block.get("is_error") is True))
    return found[:LATEST_RESULTS]


def result_places(messages: object) -> list[ResultPlace]:
    """Where every `tool_result` block of a conversation holds its result, with its call's tool
    and input where an assistant message before it has the `tool_use` block."""
    calls: dict[str, tuple[str | None, object]] = {}
    places: list[ResultPlace] = []
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        for block in content if isinstance(content, list) else ():
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "tool_use" and isinstance(call_id := block.get("id"), str):
                name = block.get("name")
                calls[call_id] = (name if isinstance(name, str) else None, block.get("input"))
            elif kind == "tool_result" and isinstance(call_id := block.get("tool_use_id"), str):
                tool, arguments = calls.get(call_id, (None, None))
                places.append(ResultPlace(call_id, block, "content", "text", tool, arguments))
    return places


async def plan_messages(api: Wire, body: Mapping[str, Any], caller: Caller, registry: ToolRegistry,
                        held: StateStore, query: str = "", path: str = "", offer: Offering = NO_OPTIONS) -> Plan:
    """A Messages request (checked) as a plan."""
    offers = offers_tools(body, offer.on_empty)
    gateway_names = registry.offered_names(caller.allowed) if offers else frozenset()
    offered = registry.specs("messages", tool_spec, caller.allowed) if offers else []
    # `thread` is the gateway's to hold (gateway.apis.messages.threads): the provider never sees it.
    base, client_names = upstream_base(body, ("messages", "stream", "thread"), tool_name, offered, gateway_names,
                                       offer.shared)
    messages = body["messages"]
    tokens = held_tokens(messages)
    found = await held.lookup(caller.principal, tokens) if tokens else NOTHING
    if tokens or names_gateway_calls(messages):
        messages = restore_messages(messages, partial(found.take, api="messages"))
    lost = any(found.take(token, "messages") is None for token in tokens)
    return Plan(api, str(body["model"]), bool(body.get("stream")), MessagesConversation(base, tuple(messages)),
                client_names, gateway_names, query=query, path=path, held_turn_lost=lost,
                client_tools=body.get("tools") or ())
