"""A streamed answer written as Responses API events, from the neutral events.

Written: `response.created` and `response.in_progress` open the stream; each part is an output
item (a text an output_text of an assistant message, consecutive texts in one message, as the
whole answer has them), its pieces deltas, its end the `.done` events; the whole response (as
responses_answer writes it, under the same item ids) closes it, `response.completed` or
`response.incomplete`. Every event carries its `sequence_number`, from 0. A message stays open
after its text ends until another item starts or the answer ends: a text that follows at once
joins it.

(Reading a provider's stream: responses_stream_reading.)"""

from __future__ import annotations

from dataclasses import astuple, dataclass, field
from typing import Any

from gateway.translate.neutral import (
    Answer,
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
)
from gateway.translate.responses_answer import (
    call_item,
    message_id,
    message_item,
    opened_response,
    output_text,
    reasoning_id,
    reasoning_item,
    response_id,
    write_answer,
)

Event = dict[str, Any]


@dataclass
class _Part:
    """A part being written: where it stands in the output, and what it has said so far."""

    start: Text | Thinking | ToolCall
    output_index: int
    item_id: str
    content_index: int = 0
    pieces: list[str] = field(default_factory=list)
    ended: bool = False

    @property
    def said(self) -> str:
        return "".join(self.pieces)

    def whole(self) -> Text | Thinking | ToolCall:
        if isinstance(self.start, ToolCall):
            return ToolCall(self.start.call_id, self.start.name, self.said)
        return Text(self.said) if isinstance(self.start, Text) else Thinking(self.said)


@dataclass
class _Message:
    output_index: int
    item_id: str
    parts: list[_Part] = field(default_factory=list)
    sealed: bool = False  # no text joins it any more

    def item(self, status: str) -> dict[str, Any]:
        return message_item(self.item_id, [part.said for part in self.parts], status)


def _merged(first: Usage, last: Usage) -> Usage:
    """The usage told at the end, completed by what was told at the start (input tokens)."""
    return Usage(*(b if b is not None else a for a, b in zip(astuple(first), astuple(last), strict=True)))


class ResponsesStreamWriting:
    """Writes one streamed answer as a Responses client reads it."""

    def __init__(self, created_at: int) -> None:
        self._created_at = created_at
        self._sequence = 0
        self._response = response_id("")
        self._model = ""
        self._usage = Usage()
        self._parts: dict[int, _Part] = {}  # by the part's index, in the order the parts started
        self._messages: dict[int, _Message] = {}  # by output index
        self._message: _Message | None = None  # the last output item, while it is a message texts may join
        self._items = 0  # output items so far

    def _event(self, kind: str, **payload: Any) -> Event:
        event = {"type": kind, "sequence_number": self._sequence, **payload}
        self._sequence += 1
        return event

    def write(self, event: StreamEvent) -> list[Event]:
        match event:
            case Started():
                return self._started(event)
            case PartStarted(part=Text() as text):
                return self._text_started(event.index, text)
            case PartStarted(part=Thinking() | ToolCall() as start):
                return self._item_started(event.index, start)
            case TextDelta() | ThinkingDelta() | ArgumentsDelta():
                return self._delta(event.index, event.text if not isinstance(event, ArgumentsDelta) else event.json)
            case PartEnded():
                return self._ended(event.index)
            case Finished():
                return self._finished(event)
        return []

    def _started(self, event: Started) -> list[Event]:
        self._response, self._model, self._usage = response_id(event.answer_id), event.model, event.usage
        opened = opened_response(self._response, self._model, self._created_at)
        return [self._event("response.created", response=opened), self._event("response.in_progress", response=opened)]

    def _seal(self) -> list[Event]:
        """Closes the message texts were joining: done now if its texts have ended."""
        message, self._message = self._message, None
        if message is None:
            return []
        message.sealed = True
        return self._message_done(message)

    def _message_done(self, message: _Message) -> list[Event]:
        if not message.sealed or not all(part.ended for part in message.parts):
            return []
        return [self._event("response.output_item.done", output_index=message.output_index,
                            item=message.item("completed"))]

    def _new_item(self) -> int:
        self._items += 1
        return self._items - 1

    def _text_started(self, index: int, start: Text) -> list[Event]:
        events: list[Event] = []
        message = self._message
        if message is None:
            where = self._new_item()
            message = self._message = self._messages[where] = _Message(where, message_id(self._response, where))
            events.append(self._event("response.output_item.added", output_index=where,
                                      item=message.item("in_progress")))
        part = _Part(start, message.output_index, message.item_id, len(message.parts))
        message.parts.append(part)
        self._parts[index] = part
        events.append(self._event("response.content_part.added", item_id=part.item_id, output_index=part.output_index,
                                  content_index=part.content_index, part=output_text("")))
        return events + self._delta(index, start.text)

    def _item_started(self, index: int, start: Thinking | ToolCall) -> list[Event]:
        if isinstance(start, Thinking) and start.redacted:
            return []  # Anthropic's cipher: nothing a Responses client can show or send back
        events = self._seal()
        where = self._new_item()
        if isinstance(start, ToolCall):
            item = call_item(ToolCall(start.call_id, start.name, ""), "in_progress")
            part = self._parts[index] = _Part(start, where, item["id"])
            events.append(self._event("response.output_item.added", output_index=where, item=item))
            return events + self._delta(index, start.arguments)
        part = self._parts[index] = _Part(start, where, reasoning_id(self._response, where))
        events += [self._event("response.output_item.added", output_index=where,
                               item=reasoning_item(part.item_id, None)),
                   self._event("response.reasoning_summary_part.added", item_id=part.item_id, output_index=where,
                               summary_index=0, part={"type": "summary_text", "text": ""})]
        return events + self._delta(index, start.text)

    def _delta(self, index: int, piece: str) -> list[Event]:
        part = self._parts.get(index)
        if part is None or part.ended or not piece:
            return []  # a part not shown (redacted thinking), or nothing said
        part.pieces.append(piece)
        where = {"item_id": part.item_id, "output_index": part.output_index}
        if isinstance(part.start, Text):
            return [self._event("response.output_text.delta", **where, content_index=part.content_index, delta=piece,
                                logprobs=[])]
        if isinstance(part.start, Thinking):
            return [self._event("response.reasoning_summary_text.delta", **where, summary_index=0, delta=piece)]
        return [self._event("response.function_call_arguments.delta", **where, delta=piece)]

    def _ended(self, index: int) -> list[Event]:
        part = self._parts.get(index)
        if part is None or part.ended:
            return []
        part.ended = True
        where = {"item_id": part.item_id, "output_index": part.output_index}
        if isinstance(part.start, ToolCall):
            whole = ToolCall(part.start.call_id, part.start.name, part.said)
            return [self._event("response.function_call_arguments.done", **where, arguments=part.said),
                    self._event("response.output_item.done", output_index=part.output_index, item=call_item(whole))]
        if isinstance(part.start, Thinking):
            summary = {"type": "summary_text", "text": part.said}
            return [self._event("response.reasoning_summary_text.done", **where, summary_index=0, text=part.said),
                    self._event("response.reasoning_summary_part.done", **where, summary_index=0, part=summary),
                    self._event("response.output_item.done", output_index=part.output_index,
                                item=reasoning_item(part.item_id, part.said))]
        return [self._event("response.output_text.done", **where, content_index=part.content_index, text=part.said,
                            logprobs=[]),
                self._event("response.content_part.done", **where, content_index=part.content_index,
                            part=output_text(part.said)),
                *self._text_ended(part)]

    def _text_ended(self, part: _Part) -> list[Event]:
        """The message of a text that ended, done if it is sealed and this was its last open text."""
        return self._message_done(self._messages[part.output_index])

    def _finished(self, event: Finished) -> list[Event]:
        events = [e for index in list(self._parts) for e in self._ended(index)]
        events += self._seal()
        answer = Answer(self._response, self._model, tuple(part.whole() for part in self._parts.values()), event.stop,
                        _merged(self._usage, event.usage), event.stop_sequence)
        response = write_answer(answer, self._created_at)
        closing = "response.completed" if response["status"] == "completed" else "response.incomplete"
        return [*events, self._event(closing, response=response)]
