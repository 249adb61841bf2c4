"""A provider's answer, JSON or assembled from its stream, Chat or Responses, as one ModelTurn.

The readers check the shape the engine relies on (a malformed answer is the provider's fault: a
502) and leave everything else as the provider sent it. Stream readers also say which events
the client may see at once: text, reasoning and other output pass; tool calls wait for the
engine's decision, and so does the end of the answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from gateway.errors import UpstreamUnavailable

Api = Literal["chat", "responses"]
# Responses output items that are calls for the caller's side to run (the provider runs the others:
# web search, file search, code interpreter, MCP ...). Only a `function_call` can be the gateway's.
CALL_ITEMS = frozenset({"function_call", "custom_tool_call", "computer_call", "local_shell_call", "shell_call",
                        "apply_patch_call"})
OPENING_EVENTS = frozenset({"response.created", "response.in_progress", "response.queued"})


@dataclass(frozen=True)
class ModelCall:
    """One tool call of a model turn. A `client` call can only be the client's: free-form (custom)
    tools, namespaced functions, computer, shell and patch calls; the gateway offers none of those."""

    id: str  # Chat: the tool call's id; Responses: the item's call_id
    name: str
    arguments: str  # the JSON text (or a custom tool's input) as the model sent it
    item: Mapping[str, Any]  # the call as the provider sent it
    kind: Literal["function", "client"] = "function"


@dataclass(frozen=True)
class ModelTurn:
    """One provider answer, whichever API and mode it came in."""

    api: Api
    body: Mapping[str, Any]  # the whole answer (assembled, when streamed)
    output: tuple[Mapping[str, Any], ...]  # Chat: the message; Responses: the output items
    calls: tuple[ModelCall, ...] = ()
    finish_reason: str | None = None  # Chat: the choice's; Responses: derived from the status
    usage: Mapping[str, Any] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)  # the provider's, those that may reach the client

    @property
    def response_id(self) -> str | None:
        """The provider's id of its answer."""
        value = self.body.get("id")
        return value if isinstance(value, str) else None

    @property
    def model(self) -> str | None:
        """The model that answered."""
        value = self.body.get("model")
        return value if isinstance(value, str) else None

    @property
    def input_tokens(self) -> int | None:
        """Prompt tokens, from either API's usage."""
        return _count(self.usage, "prompt_tokens" if self.api == "chat" else "input_tokens")

    @property
    def output_tokens(self) -> int | None:
        """Answer tokens, from either API's usage."""
        return _count(self.usage, "completion_tokens" if self.api == "chat" else "output_tokens")

    def visible_output(self) -> list[Mapping[str, Any]]:
        """Responses: the output items the client may see (every item but the tool calls)."""
        return [item for item in self.output if item.get("type") not in CALL_ITEMS]


def _count(usage: Mapping[str, Any] | None, key: str) -> int | None:
    value = usage.get(key) if usage is not None else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _text(value: Any) -> str:
    """Arguments as JSON text (some compatible providers send an object instead)."""
    if value is None or isinstance(value, str):
        return value or ""
    return orjson.dumps(value).decode()


def _usage(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    usage = body.get("usage")
    return usage if isinstance(usage, dict) else None


def add_usage(total: dict[str, Any], usage: Mapping[str, Any] | None) -> None:
    """Sum token counts into `total`, nested detail objects included."""
    for key, value in (usage or {}).items():
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            total[key] = total.get(key, 0) + value
        elif isinstance(value, dict):
            add_usage(total.setdefault(key, {}), value)


def summed_usage(turns: Sequence[ModelTurn]) -> dict[str, Any] | None:
    """Usage over every round; None when no round reported any."""
    total: dict[str, Any] = {}
    for turn in turns:
        add_usage(total, turn.usage)
    return total if any(turn.usage is not None for turn in turns) else None


# --- Chat Completions ---------------------------------------------------------------------------

def _named(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) and isinstance(value.get("name"), str) else None


def _chat_call(raw: Any) -> ModelCall:
    if isinstance(raw, dict) and (function := _named(raw.get("function"))) is not None:
        return ModelCall(str(raw.get("id") or ""), function["name"], _text(function.get("arguments")), raw)
    if isinstance(raw, dict) and (custom := _named(raw.get("custom"))) is not None:
        return ModelCall(str(raw.get("id") or ""), custom["name"], str(custom.get("input") or ""), raw, kind="client")
    raise UpstreamUnavailable("the provider sent a chat completion of the wrong shape (a tool call without a name)")


def read_chat(body: Any, headers: Mapping[str, str] | None = None) -> ModelTurn:
    """A chat completion as a turn: its first choice is the model's turn."""
    choices = body.get("choices") if isinstance(body, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices else None
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict) or not isinstance(choice, dict):
        raise UpstreamUnavailable("the provider sent a chat completion of the wrong shape")
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise UpstreamUnavailable("the provider sent a chat completion of the wrong shape (tool_calls)")
    reason = choice.get("finish_reason")
    return ModelTurn("chat", body, (message,), tuple(_chat_call(c) for c in calls) if calls else (),
                     str(reason) if reason is not None else None, _usage(body), headers or {})


@dataclass
class _ChatCallParts:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)  # a custom tool's input, for a custom call
    custom: bool = False  # a free-form (custom) tool's call: the client's

    def assembled(self) -> dict[str, Any]:
        """The call as a chat completion's message holds it."""
        text = "".join(self.arguments)
        if self.custom:
            return {"id": self.id, "type": "custom", "custom": {"name": self.name, "input": text}}
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": text}}


# A choice's fields that each chunk has anew (the others, such as content filter results, annotate it).
PER_CHUNK_FIELDS = frozenset({"index", "delta", "finish_reason", "logprobs"})


def annotates(choice: Mapping[str, Any]) -> bool:
    """A streamed choice carries something beside its delta (a content filter's results, say)."""
    return any(k not in PER_CHUNK_FIELDS and v not in (None, {}, []) for k, v in choice.items())


def says_nothing(delta: Mapping[str, Any]) -> bool:
    """A delta with nothing to show: no role, and no text but empty strings."""
    return "role" not in delta and all(value == "" for value in delta.values())


_IDENTITY = ("id", "created", "model")  # what names the answer: the first chunk that says
_PLAIN_TOP = frozenset({*_IDENTITY, "object", "choices", "usage", "system_fingerprint", "service_tier"})


class ChatStreamReader:
    """Assembles a streamed chat completion; content passes on at once, tool calls are held, and
    the provider's finish chunk is kept: the gateway's own finish chunk is written in its image."""

    def __init__(self) -> None:
        self._identity: dict[str, Any] = {}
        self._texts: dict[str, list[str]] = {}  # content, refusal, reasoning_content ... as they came
        self._calls: dict[int, _ChatCallParts] = {}
        self._finish_chunk: dict[str, Any] = {}  # the chunk that said how the answer ended
        self._finish: str | None = None
        self._usage: dict[str, Any] | None = None
        self._usage_fields: dict[str, Any] = {}  # what else the chunk that carried the usage said

    def absorb(self, chunk: dict[str, Any]) -> dict[str, Any] | None:
        """Take one chunk; returns what the client may see now (the chunk without its tool-call
        fragments, finish reason and usage), or None."""
        for key in _IDENTITY:
            if not self._identity.get(key) and chunk.get(key):  # an annotation frame may have empty ones
                self._identity[key] = chunk[key]
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
            self._usage_fields = {k: v for k, v in chunk.items() if k not in _PLAIN_TOP}  # llama.cpp's timings ...
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            # A frame without a choice: shown when it annotates the answer (a prompt filter's results).
            annotated = any(k not in _PLAIN_TOP and v not in (None, {}, []) for k, v in chunk.items())
            return {k: v for k, v in chunk.items() if k != "usage"} if annotated and "usage" not in chunk else None
        choice = choices[0]
        raw_delta = choice.get("delta")
        delta: dict[str, Any] = raw_delta if isinstance(raw_delta, dict) else {}
        if choice.get("finish_reason"):
            self._finish = str(choice["finish_reason"])
            self._finish_chunk = chunk
        parts = delta.get("tool_calls")
        for part in parts if isinstance(parts, list) else []:
            self._absorb_call(part)
        visible = {k: v for k, v in delta.items() if k != "tool_calls" and v is not None}
        for key, text in visible.items():
            if isinstance(text, str) and key != "role":
                self._texts.setdefault(key, []).append(text)
        if says_nothing(visible) and (self._finish_chunk is chunk or not annotates(choice)):
            return None  # nothing to show now; the finish chunk comes back, in full, at the end
        shown = {k: v for k, v in chunk.items() if k != "usage"}
        shown["choices"] = [{**choice, "delta": visible, "finish_reason": None}]
        return shown

    def _absorb_call(self, part: Any) -> None:
        if not isinstance(part, dict):
            return
        index = part.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            # No index (some compatible providers): a fragment with an id starts a call, one
            # without continues the last.
            starts = bool(part.get("id")) or not self._calls
            index = len(self._calls) if starts else max(self._calls)
        call = self._calls.setdefault(index, _ChatCallParts())
        call.id = call.id or str(part.get("id") or "")
        # A custom call says so in its first fragment; its input comes in `custom` fragments.
        call.custom = call.custom or part.get("type") == "custom" or (
            _named(part.get("custom")) is not None and not isinstance(part.get("function"), dict))
        raw_fragment = part.get("custom" if call.custom else "function")
        fragment: dict[str, Any] = raw_fragment if isinstance(raw_fragment, dict) else {}
        call.name = call.name or str(fragment.get("name") or "")
        arguments = fragment.get("input" if call.custom else "arguments")
        if arguments is not None:
            call.arguments.append(_text(arguments))  # some compatible servers send an object

    def turn(self, headers: Mapping[str, str] | None = None) -> ModelTurn:
        """The stream as one turn; a stream that ended without a finish reason was cut short."""
        if self._finish is None:
            raise UpstreamUnavailable("the provider's stream ended without a finish reason")
        calls = [c.assembled() for _, c in sorted(self._calls.items())]
        message: dict[str, Any] = {"role": "assistant", "content": None}
        message.update((key, "".join(parts)) for key, parts in self._texts.items())
        message["content"] = message["content"] or None
        if calls:
            message["tool_calls"] = calls
        # The finish chunk's own fields (and those of the usage chunk), under the answer's identity:
        # what the gateway's closing chunks will carry.
        top = {**self._usage_fields,
               **{k: v for k, v in self._finish_chunk.items() if k not in ("choices", "usage", "object")}}
        choice = {k: v for k, v in self._finish_chunk["choices"][0].items() if k not in PER_CHUNK_FIELDS}
        body = {**top, **self._identity, "object": "chat.completion",
                "choices": [{**choice, "index": 0, "message": message, "finish_reason": self._finish}]}
        if self._usage is not None:
            body["usage"] = self._usage
        return read_chat(body, headers)


# --- Responses ----------------------------------------------------------------------------------

def _response_call(item: Mapping[str, Any]) -> ModelCall | None:
    kind = item.get("type")
    if kind not in CALL_ITEMS:
        return None
    named = kind not in ("function_call", "custom_tool_call") or isinstance(item.get("name"), str)
    if not named or not isinstance(item.get("call_id"), str):
        raise UpstreamUnavailable("the provider sent a response of the wrong shape (a tool call without a name)")
    if kind == "function_call" and not item.get("namespace"):
        return ModelCall(item["call_id"], item["name"], _text(item.get("arguments")), item)
    return ModelCall(item["call_id"], str(item.get("name") or kind), str(item.get("input") or ""), item,
                     kind="client")


def _finish_reason(body: Mapping[str, Any], calls: tuple[ModelCall, ...]) -> str | None:
    """A response's status in Chat's terms, so that telemetry reads alike for both APIs: a
    completed response stopped or called tools; an incomplete one says why."""
    status = body.get("status")
    if status == "completed" or status is None:
        return "tool_calls" if calls else ("stop" if status else None)
    details = body.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, dict) else None
    return str(reason or status)


def _arguments_as_text(item: dict[str, Any]) -> dict[str, Any]:
    """A function call whose arguments came as an object, with them as JSON text: output items go
    back upstream in the next round's input, where the API takes only text."""
    if item.get("type") != "function_call" or isinstance(item.get("arguments"), str):
        return item
    return {**item, "arguments": _text(item.get("arguments"))}


def read_response(body: Any, headers: Mapping[str, str] | None = None) -> ModelTurn:
    """A Responses API response as a turn."""
    output = body.get("output") if isinstance(body, dict) else None
    if not isinstance(output, list) or not all(isinstance(item, dict) for item in output):
        raise UpstreamUnavailable("the provider sent a response of the wrong shape")
    usage = _usage(body)
    output = [_arguments_as_text(item) for item in output]
    calls = tuple(call for item in output if (call := _response_call(item)) is not None)
    return ModelTurn("responses", body, tuple(output), calls, _finish_reason(body, calls), usage, headers or {})


_LIFECYCLE_END = frozenset({"response.completed", "response.incomplete"})


def opens_response(piece: Mapping[str, Any]) -> bool:
    """A Responses event that opens the response (created, in progress ...) rather than shows output."""
    return piece.get("type") in OPENING_EVENTS


class ResponsesStreamReader:
    """Follows a Responses event stream: output events pass on at once, except those of tool-call
    items; the final response (from `response.completed`) becomes the turn."""

    def __init__(self) -> None:
        self._calls: set[Any] = set()  # output indexes of tool-call items
        self._final: Any = None

    def absorb(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """Take one event; returns it when the client may see it now, else None."""
        kind = event.get("type")
        if not isinstance(kind, str):
            return None  # not a Responses event: nothing a client could read
        if kind in _LIFECYCLE_END:
            self._final = event.get("response")
            return None
        if kind == "response.failed":
            response = event.get("response")
            error = response.get("error") if isinstance(response, dict) else None
            reason = error.get("message") if isinstance(error, dict) else None
            raise UpstreamUnavailable(f"the provider's response failed: {reason or 'no reason given'}")
        if kind == "error":
            raise UpstreamUnavailable(f"the provider reported an error mid-stream: {event.get('message', 'unknown')}")
        index = event.get("output_index")
        item = event.get("item")
        if kind == "response.output_item.added" and isinstance(item, dict) and item.get("type") in CALL_ITEMS:
            self._calls.add(index)
        return None if index is not None and index in self._calls else event

    def turn(self, headers: Mapping[str, str] | None = None) -> ModelTurn:
        """The response the stream completed, as one turn; a stream cut short raises."""
        if self._final is None:
            raise UpstreamUnavailable("the provider's stream ended before its response was complete")
        return read_response(self._final, headers)
