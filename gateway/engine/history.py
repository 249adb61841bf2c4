"""The conversation as the engine sends it upstream, one class per API: what each round's request
is, how a round of gateway tools extends it, what is held when the client gets the answer, and
how a held turn is put back when the client sends the conversation again. Values only: each step
returns a new one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic_core import to_jsonable_python

from gateway.engine.turn import CALL_ITEMS, ModelCall, ModelTurn
from gateway.state import PREFIX, HeldTurn, client_call_id, split_call_id
from gateway.tools import ToolOutcome

Take = Callable[[str], "HeldTurn | None"]  # a held turn by token (None: no longer held)
Owner = Callable[[str], "str | None"]  # the token of the held turn whose client saw the item of this id


class Conversation(Protocol):
    """What the engine needs of a conversation, whichever API it is in."""

    @property
    def tool_choice(self) -> Any:
        """The tool_choice the next round goes with."""

    def request(self, final: bool, stream: bool) -> dict[str, Any]:
        """The body of the next provider call (`final`: the last one, with no tools allowed)."""

    def continued(self, turn: ModelTurn, outcomes: Sequence[ToolOutcome], tool_choice: Any) -> Conversation:
        """The conversation after the gateway ran `turn`'s calls with these outcomes."""

    def held(self, turn: ModelTurn, mine: Sequence[ModelCall], theirs: Sequence[ModelCall],
             outcomes: Sequence[ToolOutcome]) -> HeldTurn:
        """What to keep when `turn` hands the client its calls (`theirs`): everything the gateway
        added in this request, then `turn` with the gateway's calls that ran (`mine`; a call dropped
        at the round limit goes) and the client's, and the outcomes of the gateway's."""

    def answered(self) -> HeldTurn | None:
        """What to keep when the model has answered, if the client can send it back: the gateway's
        rounds, where the client saw items of them it may replay (Responses)."""

    def for_client(self, call: ModelCall, token: str | None, pause: ToolOutcome | None = None) -> Mapping[str, Any]:
        """A call as the client receives it: under an id naming the held turn, if any; with the
        message and data of its tool's Interrupt when the gateway's tool paused on it."""


INTERRUPT_FIELD = "toolspan_interrupt"  # on a call handed back because the gateway's tool paused


def _paused(call: Mapping[str, Any], pause: ToolOutcome | None) -> Mapping[str, Any]:
    """`call` with the pause of its tool, when it paused: the Interrupt's message and its data."""
    if pause is None:
        return call
    data = to_jsonable_python(pause.interrupt_data, fallback=repr)
    return {**call, INTERRUPT_FIELD: {"message": pause.content_text(), "data": data}}


def _final(body: dict[str, Any], final: bool) -> dict[str, Any]:
    if final and "tools" in body:
        body["tool_choice"] = "none"
    return body


# --- Chat Completions ---------------------------------------------------------------------------

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
        body = _final({**self.base, "messages": list(self.messages)}, final)
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
        return _paused(call.item if token is None else {**call.item, "id": client_call_id(token, call.id)}, pause)


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
    conversations have neither: restore_messages is then not needed (the 40 messages of
    bench/proxy.py's 30 KB conversation: restoring 13.7 us, this check 4.5 us; timeit)."""
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


# --- Responses ----------------------------------------------------------------------------------

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


def _shown_ids(items: Sequence[Mapping[str, Any]], theirs: Sequence[ModelCall] = ()) -> tuple[str, ...]:
    """Ids of the items a client saw: every output item but the calls, and its own calls."""
    clients = {id(call.item) for call in theirs}
    return tuple(item["id"] for item in items if isinstance(item.get("id"), str) and (
        item.get("type") not in CALL_ITEMS or id(item) in clients))


@dataclass(frozen=True)
class ResponsesConversation:
    """A Responses API conversation: input items, or a stored response to continue."""

    base: Mapping[str, Any]  # the request without input, stream and previous_response_id
    items: str | tuple[Any, ...]  # the input of the next call (a string, as the client may send it)
    previous_response_id: str | None = None  # the provider response the next call continues
    added: tuple[Mapping[str, Any], ...] = ()  # the items the gateway added in this request

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
        if not self.chained:  # replay this round's items after the input, from the same starting point
            sent = ({"role": "user", "content": self.items},) if isinstance(self.items, str) else self.items
            return ResponsesConversation(base, (*sent, *turn.output, *outputs), self.previous_response_id, added)
        # A conversation object keeps the items itself; otherwise the next call names this response.
        previous = None if "conversation" in base else turn.response_id
        return ResponsesConversation(base, outputs, previous, added)

    def held(self, turn: ModelTurn, mine: Sequence[ModelCall], theirs: Sequence[ModelCall],
             outcomes: Sequence[ToolOutcome]) -> HeldTurn:
        kept = {id(call.item) for call in (*mine, *theirs)}
        output = [item for item in turn.output if item.get("type") not in CALL_ITEMS or id(item) in kept]
        results = tuple(_call_output(o) for o in outcomes)
        return HeldTurn("responses", (*self.added, *output), results, _shown_ids((*self.added, *output), theirs))

    def answered(self) -> HeldTurn | None:
        shown = _shown_ids(self.added)
        return HeldTurn("responses", self.added, (), shown) if shown else None

    def for_client(self, call: ModelCall, token: str | None, pause: ToolOutcome | None = None) -> Mapping[str, Any]:
        item = call.item if token is None else {**call.item, "call_id": client_call_id(token, call.id)}
        return _paused(item, pause)


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
