"""A Responses API conversation as the engine sends it upstream: input items, or a stored response
to continue; how a round of gateway tools extends it, what is held when the client gets the
answer, and how a held turn is put back when the client sends its input again."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gateway.apis.responses.answer import CALL_ITEMS
from gateway.apis.responses.mcp_items import approval_item
from gateway.engine.history import INTERRUPT_FIELD, Owner, Take, paused, without_tools
from gateway.engine.turn import ModelCall, ModelTurn
from gateway.mcp.declared import McpOffer
from gateway.state import HeldTurn, approval_id, client_call_id, split_call_id
from gateway.tools import ToolOutcome

_OUTPUT_ITEMS = frozenset({"function_call_output", "custom_tool_call_output"})


def _output_part(part: Mapping[str, Any]) -> Mapping[str, Any]:
    """A tool result's content part in the Responses input shape."""
    if part.get("type") == "text":
        return {"type": "input_text", "text": part.get("text", "")}
    image = part.get("image_url")
    if part.get("type") == "image_url" and isinstance(image, Mapping):
        return {"type": "input_image", "image_url": image.get("url"), "detail": image.get("detail", "auto")}
    return part


def _call_output(outcome: ToolOutcome) -> dict[str, Any]:
    content = outcome.content
    output = content if isinstance(content, str) else [_output_part(p) for p in content]
    return {"type": "function_call_output", "call_id": outcome.call_id, "output": output}


def _shown_ids(items: Sequence[Mapping[str, Any]], theirs: Sequence[ModelCall] = (),
              mcp: McpOffer | None = None) -> tuple[str, ...]:
    """Ids of the items a client saw: every output item but the calls, and its own calls; and the
    `mcp_call` items of the declared servers' calls (named by the model's call id)."""
    clients = {id(call.item) for call in theirs}
    shown = tuple(item["id"] for item in items if isinstance(item.get("id"), str) and (
        item.get("type") not in CALL_ITEMS or id(item) in clients))
    if mcp is None:
        return shown
    return shown + tuple(f"mcp_{item['call_id']}" for item in items if item.get("type") == "function_call"
                         and item.get("name") in mcp.by_name and isinstance(item.get("call_id"), str))


@dataclass(frozen=True)
class ResponsesConversation:
    """A Responses API conversation: input items, or a stored response to continue."""

    base: Mapping[str, Any]  # the request without input, stream and previous_response_id
    items: str | tuple[Any, ...]  # the input of the next call (a string, as the client may send it)
    previous_response_id: str | None = None  # the provider response the next call continues
    added: tuple[Mapping[str, Any], ...] = ()  # the items the gateway added in this request
    mcp: McpOffer | None = None  # the request's declared MCP servers, when the gateway runs them
    client_choice: Any = None  # the tool_choice the client sent (an mcp one is sent upstream as a function's)
    whole_max_bytes: int = 0  # the most of a conversation held for a follow-up by previous_response_id alone

    @property
    def tool_choice(self) -> Any:
        return self.base.get("tool_choice")

    @property
    def chained(self) -> bool:
        """Rounds continue the provider's stored state instead of replaying every item: when the
        client continues a stored response or asks for storing, and storing is not refused."""
        if self.base.get("store") is False:
            return False
        return self.previous_response_id is not None or self.base.get("store") is True or "conversation" in self.base

    def request(self, final: bool, stream: bool) -> dict[str, Any]:
        items = self.items if isinstance(self.items, str) else list(self.items)
        body = without_tools({**self.base, "input": items}, final)
        if self.previous_response_id is not None:
            body["previous_response_id"] = self.previous_response_id
        if stream:
            body["stream"] = True
        return body

    def continued(self, turn: ModelTurn, outcomes: Sequence[ToolOutcome],
                  tool_choice: Any) -> ResponsesConversation:
        base = {**self.base, "tool_choice": tool_choice} if "tool_choice" in self.base else self.base
        outputs = tuple(_call_output(o) for o in outcomes)
        added = (*self.added, *turn.output, *outputs)
        if not self.chained:  # replay this round's items after the input, from the same starting point
            sent = ({"role": "user", "content": self.items},) if isinstance(self.items, str) else self.items
            return replace(self, base=base, items=(*sent, *turn.output, *outputs), added=added)
        if turn.response_id is None:  # a round no provider answered (calls the client decided on): all still to send
            return replace(self, base=base, items=(*self.items, *outputs), added=added)
        # A conversation object keeps the items itself; otherwise the next call names this response.
        previous = None if "conversation" in base else turn.response_id
        return replace(self, base=base, items=outputs, previous_response_id=previous, added=added)

    def held(self, turn: ModelTurn, mine: Sequence[ModelCall], theirs: Sequence[ModelCall],
             outcomes: Sequence[ToolOutcome]) -> HeldTurn:
        kept = {id(call.item) for call in (*mine, *theirs)}
        output = [item for item in turn.output if item.get("type") not in CALL_ITEMS or id(item) in kept]
        results = tuple(_call_output(o) for o in outcomes)
        return HeldTurn("responses", (*self.added, *output), results,
                        _shown_ids((*self.added, *output), theirs, self.mcp), self._before())

    def _before(self) -> tuple[Mapping[str, Any], ...]:
        """The conversation before this request's rounds, when a follow-up may continue it by
        previous_response_id alone on an upstream that keeps none (calls wait for the client's
        approval); none past `whole_max_bytes`, and the follow-up must send the whole input."""
        if self.mcp is None or not self.mcp.approval or self.chained:
            return ()
        if isinstance(self.items, str):
            before: tuple[Mapping[str, Any], ...] = ({"role": "user", "content": self.items},)
        else:
            before = tuple(self.items[:len(self.items) - len(self.added)])
        size = len(json.dumps(before, ensure_ascii=False, default=str))
        return before if size <= self.whole_max_bytes else ()

    def answered(self) -> HeldTurn | None:
        shown = _shown_ids(self.added, (), self.mcp)
        return HeldTurn("responses", self.added, (), shown) if shown else None

    def for_client(self, call: ModelCall, token: str | None, pause: ToolOutcome | None = None) -> Mapping[str, Any]:
        digest = pause.interrupt_data.get("client_approval") if pause is not None and isinstance(
            pause.interrupt_data, Mapping) else None
        if self.mcp is not None and token is not None and isinstance(digest, str) and call.name in self.mcp.by_name:
            label, remote = self.mcp.by_name[call.name]
            return approval_item(approval_id(token, call.id, digest), label, remote, call.arguments)
        item = call.item if token is None else {**call.item, "call_id": client_call_id(token, call.id)}
        return paused(item, pause)


def held_names(items: Sequence[Any]) -> tuple[list[str], list[str]]:
    """What Responses input may name a held turn by: the tokens in its call ids, and the ids of
    the items it replays."""
    tokens: list[str] = []
    item_ids: list[str] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        if parts := split_call_id(item.get("call_id")):
            tokens.append(parts[0])
        elif isinstance(item_id := item.get("id"), str):
            item_ids.append(item_id)
    return tokens, item_ids


def orphans_told(items: Sequence[Any]) -> list[Any]:
    """The input with each tool result whose call it does not hold (a result for a response the
    gateway no longer knows, continued without it) as a user message saying so: a provider refuses
    a result without its call, and the model can still read what the tool returned."""
    calls = {item.get("call_id") for item in items if isinstance(item, dict) and item.get("type") in CALL_ITEMS}
    out: list[Any] = []
    for item in items:
        if not isinstance(item, dict) or item.get("type") not in _OUTPUT_ITEMS or item.get("call_id") in calls:
            out.append(item)
            continue
        said = {"type": "input_text", "text": f"The result of your earlier tool call {item.get('call_id')}:"}
        output = item.get("output")
        parts = output if isinstance(output, list) else [{"type": "input_text", "text": str(output or "")}]
        out.append({"role": "user", "content": [said, *parts]})
    return out


def restore_items(items: Sequence[Any], take: Take, owner: Owner) -> list[Any]:
    """The input with every held turn put back. Replayed input carries the client's copies of
    what it was shown (items by their ids, its calls under ids naming the turn): the held turn
    goes in place of the first of them, and its results before the client's first result. Input
    that continues a stored response carries only results: the provider has the rest."""
    out: list[Any] = []
    placed: set[tuple[str, bool]] = set()
    for item in items:
        if not isinstance(item, dict):
            out.append(item)
            continue
        parts = split_call_id(item.get("call_id"))
        item_id = item.get("id")
        token = parts[0] if parts else owner(item_id) if isinstance(item_id, str) else None
        if token is None:
            out.append(item)
            continue
        held = take(token)
        result = item.get("type") in _OUTPUT_ITEMS
        if held is None:  # no longer held: the client's copy, under the call's original id
            unwrapped = {k: v for k, v in item.items() if k != INTERRUPT_FIELD}
            out.append({**unwrapped, "call_id": parts[1]} if parts else unwrapped)
            continue
        if (token, result) not in placed:
            placed.add((token, result))
            out.extend(held.results if result else held.calls)
        if result:  # a copy of a shown item is dropped: the held turn has the original
            out.append({**item, "call_id": parts[1]} if parts else item)
    return out
