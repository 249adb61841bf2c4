"""The conversation as the engine sends it upstream, one class per API: what each round's request
is, how a round of gateway tools extends it, what of a mixed turn is held, and how a held turn
is put back when the client's follow-up arrives. Values only: each step returns a new one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.engine.turn import ModelCall, ModelTurn
from gateway.state import HeldTurn, client_call_id, split_call_id
from gateway.tools import ToolOutcome

Take = Callable[[str], HeldTurn]  # a held turn by token (raises Conflict when no longer held)


class Conversation(Protocol):
    """What the engine needs of a conversation, whichever API it is in."""

    @property
    def tool_choice(self) -> Any: ...

    def request(self, final: bool, stream: bool) -> dict[str, Any]:
        """The body of the next provider call (`final`: the last one, with no tools allowed)."""

    def continued(self, turn: ModelTurn, outcomes: Sequence[ToolOutcome], tool_choice: Any) -> Conversation:
        """The conversation after the gateway ran `turn`'s calls with these outcomes."""

    def held(self, turn: ModelTurn, outcomes: Sequence[ToolOutcome]) -> HeldTurn:
        """What to keep when `turn` hands the client its calls: everything the gateway added to
        the conversation in this request, `turn` in full, and the outcomes of its gateway calls."""

    def for_client(self, call: ModelCall, token: str | None) -> Mapping[str, Any]:
        """A client call as the client receives it (under an id naming the held turn, if any)."""


def _final(body: dict[str, Any], final: bool) -> dict[str, Any]:
    if final and "tools" in body:
        body["tool_choice"] = "none"
    return body


# --- Chat Completions ---------------------------------------------------------------------------

def _tool_message(outcome: ToolOutcome) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": outcome.call_id, "content": outcome.content}


def _assistant(turn: ModelTurn) -> dict[str, Any]:
    """The assistant turn as it goes back into the conversation (response-only fields dropped)."""
    message = turn.output[0]
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("refusal"):
        out["refusal"] = message["refusal"]
    if turn.calls:
        out["tool_calls"] = [call.item for call in turn.calls]
    return out


@dataclass(frozen=True)
class ChatConversation:
    base: Mapping[str, Any]  # the request without messages and stream fields
    messages: tuple[Any, ...]
    added: tuple[Mapping[str, Any], ...] = ()  # the messages the gateway added in this request

    @property
    def tool_choice(self) -> Any:
        return self.base.get("tool_choice")

    def request(self, final: bool, stream: bool) -> dict[str, Any]:
        body = _final({**self.base, "messages": list(self.messages)}, final)
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}  # usage is summed over rounds here
        return body

    def continued(self, turn: ModelTurn, outcomes: Sequence[ToolOutcome], tool_choice: Any) -> ChatConversation:
        base = {**self.base, "tool_choice": tool_choice} if "tool_choice" in self.base else self.base
        new = (_assistant(turn), *(_tool_message(o) for o in outcomes))
        return ChatConversation(base, (*self.messages, *new), (*self.added, *new))

    def held(self, turn: ModelTurn, outcomes: Sequence[ToolOutcome]) -> HeldTurn:
        return HeldTurn((*self.added, _assistant(turn)), tuple(_tool_message(o) for o in outcomes))

    def for_client(self, call: ModelCall, token: str | None) -> Mapping[str, Any]:
        return call.item if token is None else {**call.item, "id": client_call_id(token, call.id)}


def _held_token(message: Mapping[str, Any]) -> str | None:
    if message.get("role") != "assistant" or not isinstance(message.get("tool_calls"), list):
        return None
    for call in message["tool_calls"]:
        if isinstance(call, dict) and (parts := split_call_id(call.get("id"))):
            return parts[0]
    return None


def restore_messages(messages: Sequence[Any], take: Take) -> list[Any]:
    """The conversation with every held turn put back: in place of the assistant message the
    client saw, the messages of the gateway's rounds, the whole assistant message and the
    gateway's results after it; the client's results under their original ids."""
    out: list[Any] = []
    for message in messages:
        if not isinstance(message, dict):
            out.append(message)
        elif message.get("role") == "tool" and (parts := split_call_id(message.get("tool_call_id"))):
            out.append({**message, "tool_call_id": parts[1]})
        elif (token := _held_token(message)) is not None:
            held = take(token)
            out.extend([*held.calls, *held.results])
        else:
            out.append(message)
    return out


# --- Responses ----------------------------------------------------------------------------------

def _call_output(outcome: ToolOutcome) -> dict[str, Any]:
    content = outcome.content
    if not isinstance(content, str):  # content parts: text goes as input_text
        content = [{"type": "input_text", "text": p.get("text", "")} if p.get("type") == "text" else p
                   for p in content]
    return {"type": "function_call_output", "call_id": outcome.call_id, "output": content}


@dataclass(frozen=True)
class ResponsesConversation:
    base: Mapping[str, Any]  # the request without input, stream and previous_response_id
    items: str | tuple[Any, ...]  # the input of the next call (a string, as the client may send it)
    previous_response_id: str | None = None  # the provider response the next call continues
    added: tuple[Mapping[str, Any], ...] = ()  # the items the gateway added in this request

    @property
    def tool_choice(self) -> Any:
        return self.base.get("tool_choice")

    @property
    def chained(self) -> bool:
        """Rounds continue the provider's stored state instead of replaying every item."""
        return self.previous_response_id is not None or self.base.get("store") is True or "conversation" in self.base

    def request(self, final: bool, stream: bool) -> dict[str, Any]:
        body = _final({**self.base, "input": self.items if isinstance(self.items, str) else list(self.items)}, final)
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
        if not self.chained:
            sent = ({"role": "user", "content": self.items},) if isinstance(self.items, str) else self.items
            return ResponsesConversation(base, (*sent, *turn.output, *outputs), added=added)
        # A conversation object keeps the items itself; otherwise the next call names this response.
        previous = None if "conversation" in base else turn.response_id
        return ResponsesConversation(base, outputs, previous, added)

    def held(self, turn: ModelTurn, outcomes: Sequence[ToolOutcome]) -> HeldTurn:
        return HeldTurn((*self.added, *turn.output), tuple(_call_output(o) for o in outcomes))

    def for_client(self, call: ModelCall, token: str | None) -> Mapping[str, Any]:
        return call.item if token is None else {**call.item, "call_id": client_call_id(token, call.id)}


_OUTPUT_ITEMS = frozenset({"function_call_output", "custom_tool_call_output"})


def restore_items(items: Sequence[Any], take: Take) -> list[Any]:
    """The input with every held turn put back. Replayed input carries the client's copies of
    what it was shown (visible items by their ids, its calls under ids naming the turn): the
    turn in full goes in place of the first of them, and the gateway's results before the
    client's first result. Input that continues a stored response carries only results: the
    provider has the rest."""
    tokens = {parts[0] for item in items if isinstance(item, dict) and (parts := split_call_id(item.get("call_id")))}
    held = {token: take(token) for token in sorted(tokens)}
    owner = {item["id"]: token for token, turn in held.items() for item in turn.calls
             if isinstance(item.get("id"), str)}
    out: list[Any] = []
    placed: set[tuple[str, bool]] = set()
    for item in items:
        parts = split_call_id(item.get("call_id")) if isinstance(item, dict) else None
        token = parts[0] if parts else owner.get(item.get("id")) if isinstance(item, dict) else None
        if token is None:
            out.append(item)
            continue
        result = item.get("type") in _OUTPUT_ITEMS
        if (token, result) not in placed:
            placed.add((token, result))
            out.extend(held[token].results if result else held[token].calls)
        if result:  # a copy of a shown item is dropped: the held turn has the original
            out.append({**item, "call_id": parts[1]} if parts else item)
    return out
