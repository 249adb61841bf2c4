"""A streamed Anthropic message read into neutral events, and neutral events written as the
stream an Anthropic client reads.

Reading: a `tool_use` block starts with `"input": {}` and says its arguments only in
`input_json_delta` fragments; that `{}` is no fragment of them (joined to the fragments it would
make invalid JSON). A call whose fragments are all empty has no arguments: `{}`, said once at the
block's end.

Writing: Anthropic's clients assemble a message block by block, each from its start to its stop,
numbered in the order they start; so the parts of a neutral stream that interleave (parallel calls
of a Chat upstream) are said one after the other, the later ones' pieces held until the earlier
ones end. A call without arguments gets no `input_json_delta` at all: the SDK then keeps the
start's `{}` (an empty fragment would too, but clients that parse each delta would fail on it). A
signature is said whole, in one `signature_delta`, as the SDK keeps only the last one it reads."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import UpstreamUnavailable, stream_error
from gateway.translate.messages_answer import STOP_REASONS, read_stop, read_usage, usage_counts
from gateway.translate.messages_blocks import anthropic_call_id, arguments_text, neutral_call_id
from gateway.translate.neutral import (
    ArgumentsDelta,
    Finished,
    PartEnded,
    PartStarted,
    Started,
    Stop,
    StreamEvent,
    Text,
    TextDelta,
    Thinking,
    ThinkingDelta,
    ToolCall,
    Usage,
)

# The deltas each kind of block takes; any other (a citation) says nothing the neutral forms keep.
DELTAS = {"text": ("text_delta",), "thinking": ("thinking_delta", "signature_delta"),
          "tool_use": ("input_json_delta",), "redacted_thinking": ()}


def _broken(what: str) -> UpstreamUnavailable:
    return UpstreamUnavailable(f"the provider's stream {what}")


@dataclass
class _Reading:
    """An open block of the provider's stream: its neutral index, its kind, and for a call whether
    its arguments came and what its start said of them."""

    index: int
    kind: str
    arguments_came: bool = False
    start_arguments: str = ""


def _start_part(block: Mapping[str, Any]) -> tuple[Text | Thinking | ToolCall, str]:
    """A block's start as the part it starts (empty) and what the start already says of it."""
    kind = block.get("type")
    if kind == "tool_use":
        call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
        if not isinstance(call_id, str) or not isinstance(name, str):
            raise _broken("started a tool_use block without its id and name")
        said = arguments_text(arguments) if isinstance(arguments, Mapping) and arguments else \
            arguments if isinstance(arguments, str) else ""
        return ToolCall(neutral_call_id(call_id), name, ""), said
    if kind == "text":
        return Text(""), str(block.get("text") or "")
    if kind == "thinking":
        return Thinking(""), str(block.get("thinking") or "")
    return Thinking("", redacted=True), str(block.get("data") or "")  # redacted thinking: its data said whole


class MessagesStreamReading:
    """Reads one Messages stream: its events as neutral ones."""

    def __init__(self) -> None:
        self._started = False
        self._open: dict[int, _Reading] = {}  # by the block's index in the stream
        self._skipped: set[int] = set()  # blocks of other kinds (a server tool's)
        self._parts = 0
        self._usage = Usage()
        self._stop: Stop | None = None
        self._sequence: str | None = None
        self._finished = False

    def read(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        kind = event.get("type")
        if kind == "error":
            error = event.get("error")
            raise stream_error(error if isinstance(error, Mapping) else {})
        if kind == "message_start":
            return self._opened(event.get("message"))
        if self._finished or kind == "ping":
            return []
        if not self._started:
            raise _broken(f"sent {kind} before message_start")
        handler: Callable[[Mapping[str, Any]], list[StreamEvent]] | None = {
            "content_block_start": self._block_started, "content_block_delta": self._delta,
            "content_block_stop": self._block_stopped, "message_delta": self._message_delta,
            "message_stop": lambda _: self._finish()}.get(str(kind))
        return [] if handler is None else handler(event)  # an event of a newer API version says nothing here

    def end(self) -> list[StreamEvent]:
        if self._finished:
            return []
        if self._stop is None:
            raise _broken("ended before its message was complete")
        return self._finish()

    def _opened(self, message: Any) -> list[StreamEvent]:
        if self._started or not isinstance(message, Mapping):
            raise _broken("opened without a message, or twice")
        self._started = True
        usage = read_usage(message.get("usage"))
        self._usage = Usage(usage.input_tokens, None, usage.cache_read_tokens, usage.cache_write_tokens)
        answer_id, model = message.get("id"), message.get("model")
        return [Started(answer_id if isinstance(answer_id, str) else "", model if isinstance(model, str) else "",
                        self._usage)]

    def _index(self, event: Mapping[str, Any]) -> int:
        index = event.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            raise _broken(f"sent a {event.get('type')} event without its index")
        return index

    def _block_started(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        index, block = self._index(event), event.get("content_block")
        if index in self._open:
            raise _broken("started a block twice")
        kind = block.get("type") if isinstance(block, Mapping) else None
        if not isinstance(block, Mapping) or not isinstance(kind, str) or kind not in DELTAS:
            self._skipped.add(index)
            return []
        part, said = _start_part(block)
        reading = self._open[index] = _Reading(self._parts, kind, start_arguments=said)
        self._parts += 1
        events: list[StreamEvent] = [PartStarted(reading.index, part)]
        if said and kind != "tool_use":
            events.append(TextDelta(reading.index, said) if kind == "text" else ThinkingDelta(reading.index, said))
        return events

    def _delta(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        index, delta = self._index(event), event.get("delta")
        if index in self._skipped:
            return []
        reading = self._open.get(index)
        if reading is None or not isinstance(delta, Mapping):
            raise _broken("sent a delta of a block it never started")
        kind = delta.get("type")
        if kind not in DELTAS[reading.kind]:
            return []
        key = {"text_delta": "text", "thinking_delta": "thinking", "signature_delta": "signature"}.get(
            str(kind), "partial_json")
        piece = delta.get(key)
        if not isinstance(piece, str) or not piece:
            return []
        if kind == "text_delta":
            return [TextDelta(reading.index, piece)]
        if kind == "thinking_delta":
            return [ThinkingDelta(reading.index, piece)]
        if kind == "signature_delta":
            return [ThinkingDelta(reading.index, signature=piece)]
        reading.arguments_came = True
        return [ArgumentsDelta(reading.index, piece)]

    def _block_stopped(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        index = self._index(event)
        if index in self._skipped:
            return []
        reading = self._open.pop(index, None)
        if reading is None:
            raise _broken("stopped a block it never started")
        return self._ended(reading)

    @staticmethod
    def _ended(reading: _Reading) -> list[StreamEvent]:
        if reading.kind == "tool_use" and not reading.arguments_came:
            return [ArgumentsDelta(reading.index, reading.start_arguments or "{}"), PartEnded(reading.index)]
        return [PartEnded(reading.index)]

    def _message_delta(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        delta = event.get("delta")
        delta = delta if isinstance(delta, Mapping) else {}
        if delta.get("stop_reason") is not None:
            self._stop = read_stop(delta.get("stop_reason"))
        sequence = delta.get("stop_sequence")
        self._sequence = sequence if isinstance(sequence, str) else self._sequence
        self._usage = read_usage(event.get("usage"), self._usage)  # counts here are totals: they replace
        return []

    def _finish(self) -> list[StreamEvent]:
        if self._stop is None:
            raise _broken("stopped without saying why (no message_delta)")
        self._finished = True
        events = [event for reading in sorted(self._open.values(), key=lambda r: r.index)
                  for event in self._ended(reading)]  # blocks the provider left open end with the message
        self._open.clear()
        return [*events, Finished(self._stop, self._usage, self._sequence)]


@dataclass
class _Writing:
    """A part of the neutral stream on its way to the client: the deltas not yet said, and what is
    said only at its start (redacted thinking's data) or its end (a signature)."""

    part: Text | Thinking | ToolCall
    deltas: list[dict[str, Any]] = field(default_factory=list)
    data: list[str] = field(default_factory=list)
    signature: list[str] = field(default_factory=list)
    started: bool = False
    ended: bool = False


def _block_start(part: Text | Thinking | ToolCall, data: str) -> dict[str, Any]:
    if isinstance(part, Text):
        return {"type": "text", "text": ""}
    if isinstance(part, ToolCall):
        return {"type": "tool_use", "id": anthropic_call_id(part.call_id), "name": part.name, "input": {}}
    if part.redacted:
        return {"type": "redacted_thinking", "data": data}
    return {"type": "thinking", "thinking": "", "signature": ""}


class MessagesStreamWriting:
    """Writes one Messages stream: neutral events as Anthropic's."""

    def __init__(self) -> None:
        self._parts: dict[int, _Writing] = {}
        self._waiting: list[int] = []  # neutral indexes of the parts not yet said whole, in their order
        self._block = 0  # the index of the block said next

    def write(self, event: StreamEvent) -> list[dict[str, Any]]:
        if isinstance(event, Started):
            return [{"type": "message_start", "message": _opening(event)}]
        if isinstance(event, Finished):
            return self._finished(event)
        if isinstance(event, PartStarted):
            self._parts[event.index] = writing = _Writing(event.part)
            self._waiting.append(event.index)
            self._add(writing, _initial(event))
        elif isinstance(event, PartEnded):
            self._parts[event.index].ended = True
        else:
            self._add(self._parts[event.index], event)
        return self._said()

    @staticmethod
    def _add(writing: _Writing, event: TextDelta | ThinkingDelta | ArgumentsDelta | None) -> None:
        if isinstance(event, TextDelta) and event.text:
            writing.deltas.append({"type": "text_delta", "text": event.text})
        elif isinstance(event, ArgumentsDelta) and event.json:
            writing.deltas.append({"type": "input_json_delta", "partial_json": event.json})
        elif isinstance(event, ThinkingDelta):
            if event.signature:
                writing.signature.append(event.signature)
            if event.text and isinstance(writing.part, Thinking) and writing.part.redacted:
                writing.data.append(event.text)
            elif event.text:
                writing.deltas.append({"type": "thinking_delta", "thinking": event.text})

    def _said(self) -> list[dict[str, Any]]:
        """The events due: of the first waiting part, and of those after it once it has ended."""
        events: list[dict[str, Any]] = []
        while self._waiting:
            writing = self._parts[self._waiting[0]]
            redacted = isinstance(writing.part, Thinking) and writing.part.redacted
            if not writing.started:
                if redacted and not writing.ended:
                    break  # its data is said whole in its start
                writing.started = True
                events.append({"type": "content_block_start", "index": self._block,
                               "content_block": _block_start(writing.part, "".join(writing.data))})
            events += [{"type": "content_block_delta", "index": self._block, "delta": delta}
                       for delta in writing.deltas]
            writing.deltas.clear()
            if not writing.ended:
                break
            if writing.signature:
                events.append({"type": "content_block_delta", "index": self._block,
                               "delta": {"type": "signature_delta", "signature": "".join(writing.signature)}})
            events.append({"type": "content_block_stop", "index": self._block})
            self._block += 1
            del self._parts[self._waiting.pop(0)]
        return events

    def _finished(self, event: Finished) -> list[dict[str, Any]]:
        for index in self._waiting:
            self._parts[index].ended = True  # the answer's end ends every part
        return [*self._said(),
                {"type": "message_delta", "delta": {"stop_reason": STOP_REASONS[event.stop],
                                                    "stop_sequence": event.stop_sequence},
                 "usage": usage_counts(event.usage, whole=False)},
                {"type": "message_stop"}]


def _opening(event: Started) -> dict[str, Any]:
    """The message as its stream opens: no content yet, no stop reason, the input tokens known."""
    usage = Usage(event.usage.input_tokens, 0, event.usage.cache_read_tokens, event.usage.cache_write_tokens)
    return {"id": event.answer_id, "type": "message", "role": "assistant", "model": event.model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": usage_counts(usage)}


def _initial(event: PartStarted) -> TextDelta | ThinkingDelta | ArgumentsDelta | None:
    """What a part says already as it starts, as the delta that says it (a neutral part starts empty,
    but a writer should not lose what one says)."""
    part = event.part
    if isinstance(part, Text):
        return TextDelta(event.index, part.text)
    if isinstance(part, ToolCall):
        return ArgumentsDelta(event.index, part.arguments)
    return ThinkingDelta(event.index, part.text, part.signature)
