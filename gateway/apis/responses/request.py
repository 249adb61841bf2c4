"""A Responses API request: the fields the gateway relies on, checked, and the request as a plan."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import partial
from typing import Annotated, Any, TypeGuard

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from gateway.apis.fields import JsonObjects, checked_first_by
from gateway.apis.responses.history import ResponsesConversation, held_names, orphans_told, restore_items
from gateway.apis.responses.mcp_input import (
    McpInput,
    approval_tokens,
    has_mcp_items,
    listed_labels,
    lost_calls,
    read_mcp_input,
    resumed_calls,
)
from gateway.caller import Caller
from gateway.client_tools.results import LATEST_RESULTS
from gateway.engine.history import Take
from gateway.engine.plan import NO_OPTIONS, Offering, Plan, Wire, offers_tools, upstream_base
from gateway.engine.turn import ModelCall
from gateway.errors import BadRequest
from gateway.guardrails.client import ResultPlace
from gateway.mcp.declared import McpOffer
from gateway.state import NOTHING, RESPONSE_PREFIX, StateStore
from gateway.tools import Tool, ToolRegistry
from gateway.tools.approvals import ClientDecision
from gateway.translate.neutral import arguments_text

_OUTPUTS = ("function_call_output", "custom_tool_call_output")  # input items that carry a call's result
_CALLS = ("function_call", "custom_tool_call")  # the model's calls of the client's tools


class _ToolSpec(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: str
    name: str | None = Field(None, min_length=1)


def tool_specs_pass(value: Any) -> bool:
    """What list[_ToolSpec] takes, for the lists most clients send (orjson's dicts and strings)."""
    return type(value) is list and all(
        type(spec) is dict and type(spec.get("type")) is str
        and ((name := spec.get("name")) is None or (type(name) is str and name != ""))
        for spec in value)


ToolSpecs = Annotated[list[dict[str, Any]], checked_first_by(tool_specs_pass, TypeAdapter(list[_ToolSpec]))]


class ResponsesRequest(BaseModel):
    """The fields the gateway relies on; everything else goes to the provider untouched."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str = Field(min_length=1)
    input: str | JsonObjects | None = None
    tools: ToolSpecs | None = None
    stream: bool | None = False
    previous_response_id: str | None = Field(None, min_length=1)
    store: bool | None = None
    metadata: dict[str, Any] | None = None


def tool_spec(tool: Tool) -> dict[str, Any]:
    """A gateway tool as the Responses API declares a tool (the flat shape)."""
    return {"type": "function", "name": tool.name, "description": tool.description, "parameters": tool.schema,
            "strict": tool.strict}


def tool_name(spec: Any) -> str | None:
    """Function and custom tools have names; built-in tools (web search, file search ...) do not
    take part in the loop: the provider runs them."""
    if not isinstance(spec, Mapping) or spec.get("type") not in ("function", "custom"):
        return None
    name = spec.get("name")
    return name if isinstance(name, str) and name else None


def call_ids(items: object) -> list[str]:
    """Ids of the calls a Responses input answers or repeats (function, custom tool and other
    calls carry `call_id`), the latest first."""
    if not isinstance(items, list):
        return []
    found = [call_id for item in reversed(items) if isinstance(item, Mapping)
             and isinstance(call_id := item.get("call_id", item.get("approval_request_id")), str)]
    return list(dict.fromkeys(found))


def results(items: object) -> list[tuple[str, Any, bool | None]]:
    """(call id, output, error flag: none in this API) of the latest call outputs of an input, the
    latest first: those of its last turn. An input has no turns as such: the walk passes the
    outputs, the calls they answer and the messages of others than the model, and stops at the
    first other item (the model's text or reasoning), which ends the turn before. A client that
    answers two turns in a row with nothing of the model's between them has both read as the latest."""
    if not isinstance(items, list):
        return []
    found: list[tuple[str, Any, bool | None]] = []
    for item in reversed(items):
        if len(found) >= LATEST_RESULTS or not _in_last_turn(item):
            break
        if item.get("type") in _OUTPUTS and isinstance(call_id := item.get("call_id"), str):
            found.append((call_id, item.get("output"), None))
    return found


def _in_last_turn(item: object) -> TypeGuard[Mapping[str, Any]]:
    """Whether an input item, read from the end, may still belong to the last turn."""
    if not isinstance(item, Mapping):
        return False
    kind = item.get("type")
    if kind in _OUTPUTS or kind in _CALLS:
        return True
    return kind in (None, "message") and item.get("role") not in ("assistant", None)


def result_places(items: object) -> list[ResultPlace]:
    """Where every call output of an input holds its result (`output`), with its call's tool and
    arguments where the input has the call (or, for the tool, the output names it)."""
    calls: dict[str, tuple[str | None, object]] = {}
    places: list[ResultPlace] = []
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, dict) or not isinstance(call_id := item.get("call_id"), str):
            continue
        kind, name = item.get("type"), item.get("name")
        if kind in _CALLS:
            calls[call_id] = (name if isinstance(name, str) else None, item.get("arguments", item.get("input")))
        elif kind in _OUTPUTS:
            tool, arguments = calls.get(call_id, (None, None))
            places.append(ResultPlace(call_id, item, "output", "input_text",
                                      tool or (name if isinstance(name, str) else None), arguments))
    return places


def _mcp_offer(body: Mapping[str, Any], caller: Caller, offer: Offering) -> McpOffer | None:
    """What the request's `mcp` tools come to when the gateway runs them (None: it declares none, none
    are listed, or the provider runs them). Its refusals come before anything else is read."""
    if offer.mcp is None or (offer.provider_runs_mcp is not None and offer.provider_runs_mcp(str(body["model"]))):
        return None
    raw = body.get("input")
    listed = listed_labels(raw) if isinstance(raw, list) else frozenset()
    return offer.mcp.resolve(body.get("tools"), caller.allowed, request_id=caller.request_id or "", listed=listed,
                             continued=body.get("previous_response_id") is not None)


def _mcp_specs(body: Mapping[str, Any], mcp: McpOffer, registry: ToolRegistry) -> tuple[dict[str, Any], list[Any]]:
    """The request with its `mcp` tools out (and an mcp tool_choice made a function's), and the specs
    of the tools they offer, as the gateway's own."""
    shown = {**body, "tools": [t for t in body.get("tools") or () if not (isinstance(t, Mapping)
                                                                          and t.get("type") == "mcp")]}
    specs: list[Any] = []
    for name in sorted(mcp.names):
        if (tool := registry.get(name)) is not None:
            spec = tool_spec(tool)
            if (said := mcp.descriptions.get(mcp.by_name[name][0])) is not None:
                spec["description"] = f"{said}\n\n{spec['description'] or ''}".strip()
            specs.append(spec)
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping) and choice.get("type") == "mcp":
        named = [n for n, (label, remote) in mcp.by_name.items()
                 if label == choice.get("server_label") and remote == choice.get("name")]
        shown["tool_choice"] = {"type": "function", "name": named[0]} if named else "required"
    return shown, specs


def _held_before(decided: Iterable[ClientDecision], take: Take) -> tuple[Any, ...]:
    """The conversation a held turn kept for a follow-up by previous_response_id alone (none: the
    upstream keeps it, or it was too large to hold)."""
    for decision in decided:
        if (held := take(decision.token)) is not None and held.before:
            return tuple(held.before)
    return ()


def _decided_input(items: tuple[Any, ...], read: McpInput, mcp: McpOffer, take: Take,
                   continued: bool) -> tuple[tuple[Any, ...], tuple[ModelCall, ...], bool]:
    """The restored input without the held calls the client decided on (they run first), those
    calls, and whether the gateway held the conversation before them (continued by
    previous_response_id on an upstream that keeps none: it goes in front, and nothing is continued)."""
    kept, decided = resumed_calls(lost_calls(items, mcp), read.decided, take)
    calls = tuple(ModelCall(c["call_id"], c["name"], arguments_text(c.get("arguments")), c) for c in decided)
    before = _held_before(read.decided.values(), take) if continued else ()
    return (*before, *kept), calls, bool(before)


async def plan_responses(api: Wire, body: Mapping[str, Any], caller: Caller, registry: ToolRegistry,
                         held: StateStore, query: str = "", path: str = "", offer: Offering = NO_OPTIONS) -> Plan:
    """A Responses API request (checked) as a plan."""
    mcp = _mcp_offer(body, caller, offer)
    sent_body, mcp_specs = _mcp_specs(body, mcp, registry) if mcp is not None else (body, [])
    offers = offers_tools(body, offer.on_empty)
    gateway_names = registry.offered_names(caller.allowed) if offers else frozenset()
    offered = registry.specs("responses", tool_spec, caller.allowed) if offers else []
    if mcp is not None:
        gateway_names, offered = gateway_names | mcp.names, [*offered, *mcp_specs]
    base, client_names = upstream_base(sent_body, ("input", "stream", "previous_response_id"), tool_name,
                                       offered, gateway_names,
                                       offer.shared)
    if gateway_names and body.get("background"):
        raise BadRequest("a background response cannot run the gateway's tools; send it without background, or "
                         "to the provider with a key that offers no gateway tools", param="background")
    if caller.principal is not None and body.get("conversation") is not None:
        # A conversation is made on the pass-through (/v1/conversations), where the gateway cannot tell
        # which key made it: with keys, no key may name one and so reach another key's.
        raise BadRequest("with gateway keys a Responses request cannot name a conversation (the gateway does not "
                         "know which key made it); continue with previous_response_id instead",
                         param="conversation", code="conversation_not_supported")
    raw_input = body.get("input")
    sent = body.get("previous_response_id")
    sent = sent if isinstance(sent, str) else None
    listed: tuple[Any, ...] = () if isinstance(raw_input, str) else tuple(raw_input or ())
    tokens, item_ids = held_names(listed)
    if mcp is not None:
        tokens += approval_tokens(listed)
    found = await held.lookup(caller.principal, tokens, item_ids, sent) if tokens or item_ids or sent else NOTHING
    take = partial(found.take, api="responses")
    read = read_mcp_input(listed, take, mcp, sent is not None) if mcp is not None and has_mcp_items(listed) else None
    if read is not None:
        listed = tuple(read.items)
    if isinstance(raw_input, str):
        items: str | tuple[Any, ...] = raw_input
    elif tokens or item_ids:  # only these can name a held turn (restore_items)
        items = tuple(restore_items(listed, take, found.owner))
    else:  # most input: nothing to restore, as Chat's messages skip restore_messages
        items = listed
    resumed: tuple[ModelCall, ...] = ()
    whole = False
    if read is not None and mcp is not None and not isinstance(items, str):
        items, resumed, whole = _decided_input(items, read, mcp, take, sent is not None)
    previous = found.resolve(sent, keyed=caller.principal is not None) if sent is not None and not whole else None
    forgotten = sent is not None and previous is None and not whole  # a gateway response id it no longer knows
    if forgotten and not isinstance(items, str):
        items = tuple(orphans_told(items))
    lost = forgotten or any(found.take(token, "responses") is None for token in tokens)
    lost = lost or (read is not None and read.lost)
    conversation = ResponsesConversation(base, items, previous, mcp=mcp, client_choice=body.get("tool_choice"),
                                         whole_max_bytes=offer.whole_max_bytes)
    return Plan(api, str(body["model"]), bool(body.get("stream")), conversation, client_names,
                gateway_names, previous_response_id=sent,
                answer_id=f"{RESPONSE_PREFIX}{caller.request_id}", query=query, path=path, held_turn_lost=lost,
                client_tools=body.get("tools") or (), declared=mcp.names if mcp is not None else frozenset(),
                asks_client=mcp.approval if mcp is not None else frozenset(),
                decided=read.decided if read is not None else {}, resumed=resumed)
