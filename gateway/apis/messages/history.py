"""An Anthropic Messages conversation as the engine sends it upstream: what each round's request is,
how a round of gateway tools extends it (the assistant's message, then a user message of
`tool_result` blocks), what is held when the client gets its calls, and how a held turn is put
back when the client sends the conversation again: in place of the assistant message the client
saw, the gateway's rounds and the whole message; the gateway's results first in the user message
that brings the client's (the API wants every result of a message in the one message after it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.engine.history import INTERRUPT_FIELD, Take, paused, without_tools
from gateway.engine.turn import ModelCall, ModelTurn
from gateway.state import PREFIX, HeldTurn, client_call_id, split_call_id
from gateway.tools import ToolOutcome

NO_TOOLS = {"type": "none"}


def _image(part: Mapping[str, Any]) -> dict[str, Any]:
    """A tool's image part (Chat's shape) as a Messages image block: a data URL as base64."""
    image = part.get("image_url")
    url = str(image.get("url", "")) if isinstance(image, Mapping) else ""
    head, comma, data = url.partition(",")
    if url.startswith("data:") and comma and head.endswith(";base64"):
        return {"type": "image", "source": {"type": "base64", "media_type": head[5:-7], "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _result_part(part: Mapping[str, Any]) -> Mapping[str, Any]:
    if part.get("type") == "text":
        return {"type": "text", "text": str(part.get("text", ""))}
    if part.get("type") == "image_url":
        return _image(part)
    return part


def tool_result(outcome: ToolOutcome) -> dict[str, Any]:
    """The `tool_result` block of a gateway call's outcome: an error, a rejection or a timeout is
    `is_error`, so the model reads it as a failed call."""
    content = outcome.content
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": outcome.call_id}
    if content:
        block["content"] = content if isinstance(content, str) else [_result_part(p) for p in content]
    if outcome.status != "ok":
        block["is_error"] = True
    return block


def _replayed(block: Mapping[str, Any]) -> Mapping[str, Any]:
    """A block as it goes back upstream: a tool's input an object, as the API takes it (a model's
    JSON that did not parse was kept as text for the parse step to refuse)."""
    if block.get("type") == "tool_use" and not isinstance(block.get("input"), dict):
        return {**block, "input": {}}
    return block


def _assistant(turn: ModelTurn, kept: Sequence[ModelCall]) -> dict[str, Any]:
    """The turn as the assistant's message, every block as it came but the calls not `kept` (one
    dropped at the round limit)."""
    calls = {id(call.item) for call in turn.calls}
    keep = {id(call.item) for call in kept}
    content = [_replayed(block) for block in turn.output if id(block) not in calls or id(block) in keep]
    return {"role": "assistant", "content": content}


@dataclass(frozen=True)
class MessagesConversation:
    """A Messages conversation: the messages, and the request's other fields."""

    base: Mapping[str, Any]  # the request without messages and stream
    messages: tuple[Any, ...]
    added: tuple[Mapping[str, Any], ...] = ()  # the messages the gateway added in this request

    @property
    def tool_choice(self) -> Any:
        return self.base.get("tool_choice")

    def request(self, final: bool, stream: bool) -> dict[str, Any]:
        body = without_tools({**self.base, "messages": list(self.messages)}, final, NO_TOOLS)
        if stream:
            body["stream"] = True
        return body

    def continued(self, turn: ModelTurn, outcomes: Sequence[ToolOutcome], tool_choice: Any) -> MessagesConversation:
        base = {**self.base, "tool_choice": tool_choice} if "tool_choice" in self.base else self.base
        new = (_assistant(turn, turn.calls), {"role": "user", "content": [tool_result(o) for o in outcomes]})
        return MessagesConversation(base, (*self.messages, *new), (*self.added, *new))

    def held(self, turn: ModelTurn, mine: Sequence[ModelCall], theirs: Sequence[ModelCall],
             outcomes: Sequence[ToolOutcome]) -> HeldTurn:
        return HeldTurn("messages", (*self.added, _assistant(turn, (*mine, *theirs))),
                        tuple(tool_result(o) for o in outcomes))

    def answered(self) -> HeldTurn | None:
        return None  # a message's id names nothing a later request could continue from

    def for_client(self, call: ModelCall, token: str | None, pause: ToolOutcome | None = None) -> Mapping[str, Any]:
        return paused(call.item if token is None else {**call.item, "id": client_call_id(token, call.id)}, pause)


def _blocks(message: Mapping[str, Any]) -> list[Any]:
    content = message.get("content")
    return content if isinstance(content, list) else []


def _held_token(message: Mapping[str, Any]) -> str | None:
    if message.get("role") != "assistant":
        return None
    for block in _blocks(message):
        if isinstance(block, dict) and block.get("type") == "tool_use" and (parts := split_call_id(block.get("id"))):
            return parts[0]
    return None


def held_tokens(messages: Sequence[Any]) -> list[str]:
    """The tokens of the held turns a conversation continues."""
    return [token for m in messages if isinstance(m, dict) and (token := _held_token(m)) is not None]


def names_gateway_calls(messages: Sequence[Any]) -> bool:
    """Whether a result may answer a call under an id the gateway made (client_call_id)."""
    return any(type(block) is dict and block.get("type") == "tool_result"
               and str(block.get("tool_use_id", "")).startswith(PREFIX)
               for m in messages if type(m) is dict and m.get("role") == "user" for block in _blocks(m))


def _original(block: Any) -> Any:
    """A block under its call's original id, without the gateway's extension field."""
    if not isinstance(block, dict):
        return block
    key = "id" if block.get("type") == "tool_use" else "tool_use_id" if block.get("type") == "tool_result" else None
    parts = split_call_id(block.get(key)) if key else None
    if parts is None and INTERRUPT_FIELD not in block:
        return block
    restored = {k: v for k, v in block.items() if k != INTERRUPT_FIELD}
    if parts is not None and key is not None:
        restored[key] = parts[1]
    return restored


def _with_results(message: Mapping[str, Any], results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The client's user message with the gateway's results first, its own under their original ids."""
    content = message.get("content")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(map(_original, _blocks(message)))
    return {**message, "content": [*results, *blocks]}


def restore_messages(messages: Sequence[Any], take: Take) -> list[Any]:
    """The conversation with every held turn put back. A turn no longer held leaves the client's
    copy, its calls under their original ids: the model then sees what the client saw."""
    out: list[Any] = []
    pending: Sequence[Mapping[str, Any]] = ()  # the gateway's results, for the next user message
    for message in messages:
        if not isinstance(message, dict):
            out.append(message)
            continue
        if pending and message.get("role") != "user":
            out.append({"role": "user", "content": list(pending)})
            pending = ()
        if (token := _held_token(message)) is not None:
            held = take(token)
            if held is not None:
                out.extend(held.calls)
                pending = held.results
            else:
                out.append({**message, "content": [_original(b) for b in _blocks(message)]})
        elif message.get("role") == "user" and (pending or isinstance(message.get("content"), list)):
            out.append(_with_results(message, pending))
            pending = ()
        else:
            out.append(message)
    if pending:  # the conversation ends with the message that called: the results answer it
        out.append({"role": "user", "content": list(pending)})
    return out
