"""A streamed Chat Completions answer (`chat.completion.chunk`s) read into neutral stream events,
and neutral events written as chunks.

Reading: the first choice's delta says reasoning (`reasoning_content`, or `reasoning`), text
(`content`, or an OpenAI `refusal`) and tool-call fragments by the call's `index`; the finish
reason comes in a chunk of its own or with the last delta, and the usage after it, in a chunk
without choices (or with every chunk, vLLM's continuous usage: the last one counts). The end of
the answer is known only when the stream ends. Text and reasoning are each one part until
something else starts; a call is a part from its first fragment that names it to the finish."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import UpstreamUnavailable
from gateway.translate.chat_answer import THINKING_FIELDS, finish_fields, stop_of, usage_from, usage_json
from gateway.translate.neutral import (
    ArgumentsDelta,
    Finished,
    PartEnded,
    PartStarted,
    Started,
    StreamEvent,
    Text,
    TextDelta,
    Thinking,
    ThinkingDelta,
    ToolCall,
    Usage,
    arguments_text,
)


def _unreadable(what: str) -> UpstreamUnavailable:
    return UpstreamUnavailable(f"the provider's Chat stream {what}")


@dataclass
class _Call:
    """A tool call being read: its part starts once its name is known (fragments before wait)."""

    call_id: str = ""
    name: str = ""
    part: int | None = None
    waiting: list[str] = field(default_factory=list)


class ChatStreamReading:
    """Reads one streamed chat completion (the StreamReading of gateway.translate.sides)."""

    def __init__(self) -> None:
        self._started = False
        self._parts = 0  # neutral parts started so far: the next one's index
        self._open: list[int] = []  # in start order
        self._text: int | None = None  # the text part being written, if any
        self._thinking: int | None = None
        self._calls: dict[int, _Call] = {}  # by Chat's call index
        self._finish: tuple[Any, Any] | None = None  # the finish reason and vLLM's stop_reason
        self._usage = Usage()

    def read(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        choices = event.get("choices")
        if choices is not None and not isinstance(choices, list):
            raise _unreadable("holds a chunk whose choices are not a list")
        usage = event.get("usage")
        if isinstance(usage, Mapping):
            self._usage = usage_from(usage)
        # Azure opens with a chunk that names nothing (its prompt filter's results): the answer
        # starts at the first chunk with an id or a choice.
        if not self._started and (event.get("id") or choices):
            self._started = True
            out.append(Started(str(event.get("id") or ""), str(event.get("model") or ""),
                               Usage(input_tokens=self._usage.input_tokens)))
        if choices:
            out.extend(self._choice(choices[0]))
        return out

    def end(self) -> list[StreamEvent]:
        if self._finish is None:
            raise _unreadable("ended without a finish reason")
        stop, sequence = stop_of(*self._finish, calls=bool(self._calls))
        return [Finished(stop, self._usage, sequence)]

    def _choice(self, choice: Any) -> list[StreamEvent]:
        delta = choice.get("delta") if isinstance(choice, Mapping) else None
        if not isinstance(choice, Mapping) or not isinstance(delta, Mapping | None):
            raise _unreadable("holds a choice without a delta object")
        out: list[StreamEvent] = []
        if delta:
            out += self._plain(Thinking(""), next((text for key in THINKING_FIELDS if (text := _text(delta, key))), ""))
            out += self._plain(Text(""), _text(delta, "content") or _text(delta, "refusal"))
            out += self._call_fragments(delta.get("tool_calls"))
        if choice.get("finish_reason"):
            self._finish = (choice["finish_reason"], choice.get("stop_reason"))
            out += self._end_all()
        return out

    def _start(self, part: Text | Thinking | ToolCall) -> tuple[int, PartStarted]:
        index = self._parts
        self._parts += 1
        self._open.append(index)
        return index, PartStarted(index, part)

    def _end(self, index: int | None) -> list[StreamEvent]:
        if index is None or index not in self._open:
            return []
        self._open.remove(index)
        return [PartEnded(index)]

    def _end_plain(self) -> list[StreamEvent]:
        """Text or reasoning ends when something else starts: what comes later is a new part."""
        ended = self._end(self._thinking) + self._end(self._text)
        self._thinking = self._text = None
        return ended

    def _plain(self, kind: Text | Thinking, text: str) -> list[StreamEvent]:
        if not text:
            return []
        out: list[StreamEvent] = []
        index = self._text if isinstance(kind, Text) else self._thinking
        if index is None:
            out += self._end_plain()
            index, started = self._start(kind)
            out.append(started)
            if isinstance(kind, Text):
                self._text = index
            else:
                self._thinking = index
        out.append(TextDelta(index, text) if isinstance(kind, Text) else ThinkingDelta(index, text))
        return out

    def _call_fragments(self, fragments: Any) -> list[StreamEvent]:
        if fragments is None:
            return []
        if not isinstance(fragments, list) or not all(isinstance(f, Mapping) for f in fragments):
            raise _unreadable("holds tool_calls that are not a list of objects")
        return [event for fragment in fragments for event in self._call_fragment(fragment)]

    def _call_index(self, fragment: Mapping[str, Any]) -> int:
        index = fragment.get("index")
        if isinstance(index, int) and not isinstance(index, bool):
            return index
        # No index (some compatible servers): a fragment with an id starts a call, one without
        # continues the last.
        if fragment.get("id") or not self._calls:
            return max(self._calls, default=-1) + 1
        return max(self._calls)

    def _call_fragment(self, fragment: Mapping[str, Any]) -> list[StreamEvent]:
        call = self._calls.setdefault(self._call_index(fragment), _Call())
        function = fragment.get("function")
        function = function if isinstance(function, Mapping) else {}
        call.call_id = call.call_id or str(fragment.get("id") or "")
        call.name = call.name or str(function.get("name") or "")
        arguments = function.get("arguments")
        # Some servers send the whole arguments with the name, some "" first, llama.cpp an object.
        piece = arguments_text(arguments) if isinstance(arguments, str | Mapping) else ""
        if call.part is not None:
            return [ArgumentsDelta(call.part, piece)] if piece else []
        call.waiting.append(piece)
        if not call.name:
            return []
        out = self._end_plain()
        call.part, started = self._start(ToolCall(call.call_id, call.name, ""))
        out.append(started)
        if waited := "".join(call.waiting):
            out.append(ArgumentsDelta(call.part, waited))
        call.waiting.clear()
        return out

    def _end_all(self) -> list[StreamEvent]:
        if any(call.part is None for call in self._calls.values()):
            raise _unreadable("holds a tool call without a function name")
        ended: list[StreamEvent] = [PartEnded(index) for index in self._open]
        self._open.clear()
        self._thinking = self._text = None
        return ended


def _text(delta: Mapping[str, Any], key: str) -> str:
    value = delta.get(key)
    if value is not None and not isinstance(value, str):
        raise _unreadable(f"holds a delta whose {key} is not text")
    return value or ""


class ChatStreamWriting:
    """Writes a streamed answer as chat.completion.chunks (the StreamWriting of
    gateway.translate.sides): text as content, reasoning as vLLM's `reasoning_content`, the calls
    numbered in their order, the finish reason, then the usage in a chunk without choices
    (`usage_chunk`: the client asked for it with stream_options.include_usage)."""

    def __init__(self, usage_chunk: bool = True) -> None:
        self._usage_chunk = usage_chunk
        self._head: dict[str, Any] = {}  # id, object, created, model: what every chunk carries
        self._calls: dict[int, int] = {}  # a call's neutral part index: its Chat index

    def write(self, event: StreamEvent) -> list[dict[str, Any]]:
        match event:
            case Started():
                self._head = {"id": event.answer_id, "object": "chat.completion.chunk",
                              "created": int(time.time()), "model": event.model}
                return [self._chunk({"role": "assistant", "content": ""})]
            case TextDelta(text=text) if text:
                return [self._chunk({"content": text})]
            case ThinkingDelta(text=text) if text:
                return [self._chunk({"reasoning_content": text})]
            case PartStarted(index=index, part=ToolCall() as call):
                self._calls[index] = len(self._calls)
                opening = {"index": self._calls[index], "id": call.call_id, "type": "function",
                           "function": {"name": call.name, "arguments": ""}}
                return [self._chunk({"tool_calls": [opening]})]
            case ArgumentsDelta(index=index, json=json) if json and index in self._calls:
                return [self._chunk({"tool_calls": [{"index": self._calls[index], "function": {"arguments": json}}]})]
            case Finished():
                return self._finished(event)
        return []

    def _chunk(self, delta: dict[str, Any], finish: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return {**self._head, "choices": [{"index": 0, "delta": delta, **(finish or {"finish_reason": None})}]}

    def _finished(self, event: Finished) -> list[dict[str, Any]]:
        chunks = [self._chunk({}, finish_fields(event.stop, event.stop_sequence))]
        usage = usage_json(event.usage)
        if self._usage_chunk and usage is not None:
            chunks.append({**self._head, "choices": [], "usage": usage})
        return chunks
