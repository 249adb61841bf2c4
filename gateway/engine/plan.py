"""Planning a request: which tools are offered, whose tools are whose, what goes upstream first,
and what the client asked to get back. One function per API; both end in the same Plan."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from gateway.caller import Caller
from gateway.engine.history import (
    ChatConversation,
    Conversation,
    ResponsesConversation,
    held_names,
    held_tokens,
    names_gateway_calls,
    orphans_told,
    restore_items,
    restore_messages,
)
from gateway.engine.turn import Api
from gateway.errors import BadRequest
from gateway.state import NOTHING, RESPONSE_PREFIX, StateStore
from gateway.tools import ToolRegistry


@dataclass(frozen=True)
class Plan:
    """A request as the engine works on it."""

    api: Api
    model: str
    stream: bool
    conversation: Conversation
    client_names: frozenset[str]  # the client's own tools: their calls go back to the client
    gateway_names: frozenset[str]  # the gateway's tools offered to the model
    include_usage: bool = False  # Chat streams: the client asked for a usage chunk
    previous_response_id: str | None = None  # Responses: the id the client continued from, as it sent it
    answer_id: str | None = None  # Responses: the id of the answer, should it take several provider responses
    query: str = ""  # the caller's query string, which goes with every provider call
    path: str = ""  # the path the caller addressed (an Azure surface names the provider's)
    held_turn_lost: bool = False  # it continues a turn (or gateway response) the gateway no longer holds
    client_tools: Sequence[Any] = ()  # the client's own tools as it declared them (gateway.client_calls)


def _chat_tool_name(spec: Any) -> str | None:
    if not isinstance(spec, Mapping):
        return None
    inner = spec.get("function") if spec.get("type", "function") == "function" else spec.get(str(spec.get("type")))
    name = inner.get("name") if isinstance(inner, Mapping) else None
    return name if isinstance(name, str) and name else None


def _responses_tool_name(spec: Any) -> str | None:
    """Function and custom tools have names; built-in tools (web search, file search ...) do not
    take part in the loop: the provider runs them."""
    if not isinstance(spec, Mapping) or spec.get("type") not in ("function", "custom"):
        return None
    name = spec.get("name")
    return name if isinstance(name, str) and name else None


def _offers_tools(body: Mapping[str, Any], offer_on_empty: bool) -> bool:
    """Whether the gateway offers its tools: not to a request that sends `tools: []`, which asks
    for an answer without tools on purpose (the Codex CLI's compaction does), unless the
    `offer_tools_on_empty_tools` setting says otherwise. Without `tools`, it does."""
    tools = body.get("tools")
    return offer_on_empty or not (isinstance(tools, list) and not tools)


def _check_clash(client_names: frozenset[str], gateway_names: frozenset[str], param: str) -> None:
    if client_names and (clash := sorted(client_names & gateway_names)):
        raise BadRequest(f"tool '{clash[0]}' is provided by the gateway; rename or remove your own tool of that "
                         "name", param=param, code="tool_name_conflict")


def _without_own_fields(body: Mapping[str, Any], drop: tuple[str, ...]) -> dict[str, Any]:
    """The request without the fields each round sets itself and those only the gateway reads:
    `metadata.trajectory_id` (and `metadata`, when nothing else is left in it)."""
    base = {k: v for k, v in body.items() if k not in drop}
    metadata = base.get("metadata")
    if isinstance(metadata, dict) and "trajectory_id" in metadata:
        rest = {k: v for k, v in metadata.items() if k != "trajectory_id"}
        if rest:
            base["metadata"] = rest
        else:
            del base["metadata"]
    return base


def _upstream_base(body: Mapping[str, Any], drop: tuple[str, ...], name_of: Callable[[Any], str | None],
                   offered: list[dict[str, Any]],
                   gateway_names: frozenset[str]) -> tuple[dict[str, Any], frozenset[str]]:
    """What goes upstream of the request, its tools followed by the gateway's offered ones; and
    the names of the client's own tools (one named like a gateway tool is a 400)."""
    caller_tools = list(body.get("tools") or [])
    client_names = frozenset(n for t in caller_tools if (n := name_of(t)))
    _check_clash(client_names, gateway_names, "tools")
    base = _without_own_fields(body, drop)
    if caller_tools or offered:
        base["tools"] = [*caller_tools, *offered]
    return base, client_names


async def plan_chat(body: Mapping[str, Any], caller: Caller, registry: ToolRegistry, held: StateStore,
              query: str = "", path: str = "", offer_on_empty: bool = False) -> Plan:
    """A Chat Completions request (checked by the route) as a plan."""
    offers = _offers_tools(body, offer_on_empty)
    gateway_names = registry.offered_names(caller.allowed) if offers else frozenset()
    base, client_names = _upstream_base(body, ("messages", "stream", "stream_options"), _chat_tool_name,
                                        registry.openai_tools(caller.allowed) if offers else [], gateway_names)
    legacy = frozenset(f["name"] for f in body.get("functions") or [] if isinstance(f, dict)
                       and isinstance(f.get("name"), str))
    _check_clash(legacy, gateway_names, "functions")
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
    return Plan("chat", str(body["model"]), bool(body.get("stream")), conversation, client_names | legacy,
                gateway_names, include_usage=include_usage, query=query, path=path, held_turn_lost=lost,
                client_tools=body.get("tools") or ())


async def plan_responses(body: Mapping[str, Any], caller: Caller, registry: ToolRegistry, held: StateStore,
                   query: str = "", path: str = "", offer_on_empty: bool = False) -> Plan:
    """A Responses API request (checked by the route) as a plan."""
    offers = _offers_tools(body, offer_on_empty)
    gateway_names = registry.offered_names(caller.allowed) if offers else frozenset()
    base, client_names = _upstream_base(body, ("input", "stream", "previous_response_id"), _responses_tool_name,
                                        registry.responses_tools(caller.allowed) if offers else [], gateway_names)
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
    found = await held.lookup(caller.principal, tokens, item_ids, sent) if tokens or item_ids or sent else NOTHING
    if isinstance(raw_input, str):
        items: str | tuple[Any, ...] = raw_input
    elif tokens or item_ids:  # only these can name a held turn (restore_items)
        items = tuple(restore_items(listed, partial(found.take, api="responses"), found.owner))
    else:  # most input: nothing to restore, as Chat's messages skip restore_messages (bench/proxy.py's
        # 30 KB input, toolspan-notel: about 8% fewer instructions a request, bench/instructions.py)
        items = listed
    previous = found.resolve(sent, keyed=caller.principal is not None) if sent is not None else None
    forgotten = sent is not None and previous is None  # a gateway response id it no longer knows
    if forgotten and not isinstance(items, str):
        items = tuple(orphans_told(items))
    lost = forgotten or any(found.take(token, "responses") is None for token in tokens)
    conversation = ResponsesConversation(base, items, previous)
    return Plan("responses", str(body["model"]), bool(body.get("stream")), conversation, client_names,
                gateway_names, previous_response_id=sent,
                answer_id=f"{RESPONSE_PREFIX}{caller.request_id}", query=query, path=path, held_turn_lost=lost,
                client_tools=body.get("tools") or ())
