"""A Chat Completions conversation as the engine sends it upstream: what each round's request is,
how a round of gateway tools extends it, what is held when the client gets the answer, and how a
held turn is put back when the client sends the conversation again."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.engine.history import INTERRUPT_FIELD, Take, paused, without_tools
from gateway.engine.turn import ModelCall, ModelTurn
from gateway.state import PREFIX, HeldTurn, client_call_id, split_call_id
from gateway.tools import ToolOutcome


def _tool_message(outcome: ToolOutcome) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": outcome.call_id, "content": outcome.content}


def _assistant(turn: ModelTurn, calls: Sequence[ModelCall]) -> dict[str, Any]:
    """The assistant turn as it goes back into the conversation (response-only fields dropped)."""
    message = turn.output[0]
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("refusal"):
        out["refusal"] = message["refusal"]
    if calls:
        out["tool_calls"] = [_replayed(call) for call in calls]
    return out


def _replayed(call: ModelCall) -> Mapping[str, Any]:
    """A call as it goes back upstream: with its arguments as JSON text, which is all the API
    takes there, though some compatible servers answered with an object."""
    function = call.item.get("function")
    if not isinstance(function, dict) or isinstance(function.get("arguments"), str):
        return call.item
    return {**call.item, "function": {**function, "arguments": call.arguments}}


@dataclass(frozen=True)
class ChatConversation:
    """A Chat Completions conversation: messages."""

    base: Mapping[str, Any]  # the request without messages and stream fields
    messages: tuple[Any, ...]
    added: tuple[Mapping[str, Any], ...] = ()  # the messages the gateway added in this request
    stream_options: Mapping[str, Any] = field(default_factory=dict)  # the caller's, for streamed calls

    @property
    def tool_choice(self) -> Any:
        return self.base.get("tool_choice")

    def request(self, final: bool, stream: bool) -> dict[str, Any]:
        body = without_tools({**self.base, "messages": list(self.messages)}, final)
        if stream:
            body["stream"] = True
            body["stream_options"] = {**self.stream_options, "include_usage": True}  # usage is summed here
        return body

    def continued(self, turn: ModelTurn, outcomes: Sequence[ToolOutcome], tool_choice: Any) -> ChatConversation:
        base = {**self.base, "tool_choice": tool_choice} if "tool_choice" in self.base else self.base
        new = (_assistant(turn, turn.calls), *(_tool_message(o) for o in outcomes))
        return ChatConversation(base, (*self.messages, *new), (*self.added, *new), self.stream_options)

    def held(self, turn: ModelTurn, mine: Sequence[ModelCall], theirs: Sequence[ModelCall],
             outcomes: Sequence[ToolOutcome]) -> HeldTurn:
        ran_or_theirs = {id(call) for call in (*mine, *theirs)}
        kept = [call for call in turn.calls if id(call) in ran_or_theirs]
        return HeldTurn("chat", (*self.added, _assistant(turn, kept)), tuple(_tool_message(o) for o in outcomes))

    def answered(self) -> HeldTurn | None:
        return None  # an answer's message carries no id a later request could name it by

    def for_client(self, call: ModelCall, token: str | None, pause: ToolOutcome | None = None) -> Mapping[str, Any]:
        return paused(call.item if token is None else {**call.item, "id": client_call_id(token, call.id)}, pause)


def _held_token(message: Mapping[str, Any]) -> str | None:
    if message.get("role") != "assistant" or not isinstance(message.get("tool_calls"), list):
        return None
    for call in message["tool_calls"]:
        if isinstance(call, dict) and (parts := split_call_id(call.get("id"))):
            return parts[0]
    return None


def held_tokens(messages: Sequence[Any]) -> list[str]:
    """The tokens of the held turns a Chat conversation continues."""
    return [token for m in messages if isinstance(m, dict) and (token := _held_token(m)) is not None]


def names_gateway_calls(messages: Sequence[Any]) -> bool:
    """Whether a tool result may answer a call under an id the gateway made (client_call_id): the
    conversation then may have something to restore, even when it names no held turn. Most
    conversations have neither: restore_messages is then not needed, and this check costs a third
    of it."""
    return any(type(m) is dict and type(call_id := m.get("tool_call_id")) is str and call_id.startswith(PREFIX)
               for m in messages)


def restore_messages(messages: Sequence[Any], take: Take) -> list[Any]:
    """The conversation with every held turn put back: in place of the assistant message the
    client saw, the messages of the gateway's rounds, the whole assistant message and the
    gateway's results after it; the client's results under their original ids. A turn no longer
    held leaves the client's copy, its calls under their original ids: the model then sees what
    the client saw, without the gateway's rounds."""
    out: list[Any] = []
    for message in messages:
        if not isinstance(message, dict):
            out.append(message)
        elif message.get("role") == "tool" and (parts := split_call_id(message.get("tool_call_id"))):
            out.append({**message, "tool_call_id": parts[1]})
        elif (token := _held_token(message)) is not None:
            held = take(token)
            out.extend([*held.calls, *held.results] if held is not None else [_as_sent(message)])
        else:
            out.append(message)
    return out


def _as_sent(message: Mapping[str, Any]) -> dict[str, Any]:
    """The client's copy of an assistant message of a turn no longer held, its calls as the
    model made them: their original ids, without the gateway's extension field."""
    calls = []
    for call in message["tool_calls"]:
        if isinstance(call, dict):
            parts = split_call_id(call.get("id"))
            call = {k: v for k, v in call.items() if k != INTERRUPT_FIELD}
            if parts:
                call["id"] = parts[1]
        calls.append(call)
    return {**message, "tool_calls": calls}

