"""A Responses provider's event stream read into neutral events (the writing: responses_stream).

Parts are numbered in the order they start: a message's text at its content part (a refusal is a
text too), a function call at its output item, a reasoning item's thinking at its first summary
part (a reasoning item with no summary says nothing another API could take). A part told only
whole in its `.done` event (some servers send no deltas) starts, grows and ends there. The answer
ends at `response.completed` or `response.incomplete`; a stream that ends before either was cut
short, and a failed response is the provider's failure."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gateway.errors import UpstreamUnavailable
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
)
from gateway.translate.responses_answer import (
    SUMMARY_JOINER,
    check_finished,
    message_texts,
    read_call,
    read_stop,
    read_usage,
    summary_text,
    wrong_shape,
)

_TEXT_PARTS = ("output_text", "refusal")


def _place(event: Mapping[str, Any], key: str) -> int:
    value = event.get(key)
    if not isinstance(value, int):
        raise wrong_shape(f"an event without its {key}")
    return value


def _piece(event: Mapping[str, Any], key: str) -> str:
    value = event.get(key)
    return value if isinstance(value, str) else ""


class ResponsesStreamReading:
    """Reads one streamed answer of a Responses provider."""

    def __init__(self) -> None:
        self._next = 0  # the index of the next part to start
        self._texts: dict[tuple[int, int], int] = {}  # (output index, content index) -> part
        self._items: dict[int, int] = {}  # output index -> part, for calls and reasoning
        self._summaries: dict[int, int] = {}  # output index -> the summary part its reasoning last told
        self._streamed: set[int] = set()  # calls whose arguments have come
        self._open: dict[int, None] = {}  # parts started and not ended, in order
        self._called = False
        self._finished = False
        self._read: dict[str, Callable[[Mapping[str, Any]], list[StreamEvent]]] = {
            "response.created": self._created,
            "response.output_item.added": self._item_added,
            "response.content_part.added": self._content_added,
            "response.output_text.delta": self._text_delta,
            "response.refusal.delta": self._text_delta,
            "response.content_part.done": self._content_done,
            "response.function_call_arguments.delta": self._arguments_delta,
            "response.function_call_arguments.done": self._arguments_done,
            "response.reasoning_summary_part.added": self._summary_added,
            "response.reasoning_summary_text.delta": self._summary_delta,
            "response.output_item.done": self._item_done,
            "response.completed": self._completed,
            "response.incomplete": self._completed,
            "response.failed": self._failed,
            "error": self._error,
        }

    def read(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        kind = event.get("type")
        reader = self._read.get(kind) if isinstance(kind, str) else None
        return reader(event) if reader is not None else []  # events of hosted tools, annotations ...

    def end(self) -> list[StreamEvent]:
        if not self._finished:
            raise UpstreamUnavailable("the provider's stream ended before its response was complete")
        return []

    def _start(self, part: Text | Thinking | ToolCall) -> tuple[int, list[StreamEvent]]:
        index, self._next = self._next, self._next + 1
        self._open[index] = None
        self._called = self._called or isinstance(part, ToolCall)
        return index, [PartStarted(index, part)]

    def _end(self, index: int | None) -> list[StreamEvent]:
        if index is None or index not in self._open:
            return []
        del self._open[index]
        return [PartEnded(index)]

    def _said(self, index: int, piece: TextDelta | ThinkingDelta | ArgumentsDelta) -> list[StreamEvent]:
        """A piece of an open part; nothing once the part has ended, or when the piece is empty."""
        said = piece.json if isinstance(piece, ArgumentsDelta) else piece.text
        return [piece] if said and index in self._open else []

    def _created(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        response = event.get("response")
        if not isinstance(response, Mapping) or not isinstance(response.get("id"), str):
            raise wrong_shape("a response.created event without its response")
        model = response.get("model")
        return [Started(response["id"], model if isinstance(model, str) else "", read_usage(response.get("usage")))]

    def _item_added(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        item = event.get("item")
        if not isinstance(item, Mapping) or item.get("type") != "function_call":
            return []  # a message starts at its content part, reasoning at its summary
        return self._call_started(_place(event, "output_index"), read_call(item))

    def _call_started(self, where: int, call: ToolCall) -> list[StreamEvent]:
        index, events = self._start(ToolCall(call.call_id, call.name, ""))
        self._items[where] = index
        if call.arguments:
            self._streamed.add(index)
            events.append(ArgumentsDelta(index, call.arguments))
        return events

    def _text_index(self, where: int, content: int) -> tuple[int, list[StreamEvent]]:
        """The part of a message's content, started if this is the first word of it."""
        if (where, content) in self._texts:
            return self._texts[(where, content)], []
        index, events = self._start(Text(""))
        self._texts[(where, content)] = index
        return index, events

    def _content_added(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        part = event.get("part")
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind not in _TEXT_PARTS or not isinstance(part, Mapping):
            return []
        index, events = self._text_index(_place(event, "output_index"), _place(event, "content_index"))
        return events + self._said(index, TextDelta(index, _piece(part, "refusal" if kind == "refusal" else "text")))

    def _text_delta(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        index, events = self._text_index(_place(event, "output_index"), _place(event, "content_index"))
        return events + self._said(index, TextDelta(index, _piece(event, "delta")))

    def _content_done(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        return self._end(self._texts.get((_place(event, "output_index"), _place(event, "content_index"))))

    def _arguments_delta(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        index = self._items.get(_place(event, "output_index"))
        if index is None:
            return []
        self._streamed.add(index)
        return self._said(index, ArgumentsDelta(index, _piece(event, "delta")))

    def _arguments_done(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        """The whole arguments: said here only when no delta said them."""
        index = self._items.get(_place(event, "output_index"))
        said = _piece(event, "arguments")
        if index is None or index in self._streamed or not said:
            return []
        self._streamed.add(index)
        return [ArgumentsDelta(index, said)]

    def _summary_added(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        """A reasoning item's first summary part starts its thinking."""
        where = _place(event, "output_index")
        if where in self._items:
            return []
        index, events = self._start(Thinking(""))
        self._items[where] = index
        return events

    def _summary_delta(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        """A piece of a summary part; the text of each part after the first is a paragraph apart
        from the one before (a part that says nothing adds no paragraph)."""
        where, summary, said = _place(event, "output_index"), _place(event, "summary_index"), _piece(event, "delta")
        events = self._summary_added(event)
        if not said:
            return events
        index, told = self._items[where], self._summaries.get(where)
        if told is not None and told != summary:
            events += self._said(index, ThinkingDelta(index, SUMMARY_JOINER))
        self._summaries[where] = summary
        return events + self._said(index, ThinkingDelta(index, said))

    def _item_done(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        item, where = event.get("item"), _place(event, "output_index")
        kind = item.get("type") if isinstance(item, Mapping) else None
        if not isinstance(item, Mapping):
            raise wrong_shape("a response.output_item.done event without its item")
        if kind == "function_call":
            return self._call_done(where, item)
        if kind == "message":
            return self._message_done(where, item)
        if kind == "reasoning":
            return self._reasoning_done(where, item)
        return []

    def _call_done(self, where: int, item: Mapping[str, Any]) -> list[StreamEvent]:
        call = read_call(item)
        events = self._call_started(where, call) if where not in self._items else []
        index = self._items[where]
        if index not in self._streamed and call.arguments:
            self._streamed.add(index)
            events.append(ArgumentsDelta(index, call.arguments))
        return events + self._end(index)

    def _message_done(self, where: int, item: Mapping[str, Any]) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        for content, said in enumerate(message_texts(item)):
            if (where, content) not in self._texts:  # told only whole, here
                index, started = self._text_index(where, content)
                events += [*started, *([TextDelta(index, said)] if said else [])]
        for (at, _), index in list(self._texts.items()):
            if at == where:
                events += self._end(index)
        return events

    def _reasoning_done(self, where: int, item: Mapping[str, Any]) -> list[StreamEvent]:
        if where in self._items:
            return self._end(self._items[where])
        said = summary_text(item)
        if said is None:
            return []
        index, events = self._start(Thinking(""))
        self._items[where] = index
        return [*events, *([ThinkingDelta(index, said)] if said else []), *self._end(index)]

    def _completed(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        response = event.get("response")
        if not isinstance(response, Mapping):
            raise wrong_shape("a closing event without its response")
        check_finished(response)
        events = [ended for index in list(self._open) for ended in self._end(index)]
        self._finished = True
        return [*events, Finished(read_stop(response, self._called), read_usage(response.get("usage")))]

    def _failed(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        response = event.get("response")
        check_finished({"status": "failed", "error": response.get("error") if isinstance(response, Mapping) else None})
        return []  # not reached: a failed response raises

    def _error(self, event: Mapping[str, Any]) -> list[StreamEvent]:
        raise UpstreamUnavailable(f"the provider reported an error mid-stream: {_piece(event, 'message') or 'unknown'}")
