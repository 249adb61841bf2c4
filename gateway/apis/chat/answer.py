"""Reading a Chat Completions answer, JSON or assembled from its stream, as one ModelTurn.

The readers check the shape the engine relies on (a malformed answer is the provider's fault: a
502) and leave everything else as the provider sent it. The stream reader passes content on at
once; tool calls wait for the engine's decision, and so does the end of the answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.engine.turn import ModelCall, ModelTurn, count, usage_of
from gateway.errors import UpstreamUnavailable
from gateway.translate.neutral import arguments_text


def _named(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) and isinstance(value.get("name"), str) else None


def _chat_call(raw: Any) -> ModelCall:
    if isinstance(raw, dict) and (function := _named(raw.get("function"))) is not None:
        return ModelCall(str(raw.get("id") or ""), function["name"], arguments_text(function.get("arguments")), raw)
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
    usage = usage_of(body)
    return ModelTurn("chat", body, (message,), tuple(_chat_call(c) for c in calls) if calls else (),
                     str(reason) if reason is not None else None, usage, headers or {},
                     count(usage, "prompt_tokens"), count(usage, "completion_tokens"))


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
            call.arguments.append(arguments_text(arguments))  # some compatible servers send an object

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

