"""Helpers for the Chat side's stream tests: a Chat stream read into neutral events, and neutral
events assembled into the answer they say, checking on the way that they keep the order
gateway.translate.neutral promises (Started first, each part's pieces between its start and its
end, parts numbered in start order, Finished last)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gateway.translate.chat import CHAT
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
)


def read_chunks(chunks: Iterable[Mapping[str, Any]]) -> list[StreamEvent]:
    reading = CHAT.stream_reading()
    events = [event for chunk in chunks for event in reading.read(chunk)]
    return events + reading.end()


def _grown(part: Text | Thinking | ToolCall, event: StreamEvent) -> Text | Thinking | ToolCall:
    if isinstance(event, TextDelta) and isinstance(part, Text):
        return Text(part.text + event.text)
    if isinstance(event, ThinkingDelta) and isinstance(part, Thinking):
        return Thinking(part.text + event.text, event.signature or part.signature, part.redacted)
    if isinstance(event, ArgumentsDelta) and isinstance(part, ToolCall):
        return ToolCall(part.call_id, part.name, part.arguments + event.json)
    raise AssertionError(f"{event} does not fit {part}")


def assembled(events: list[StreamEvent]) -> Answer:
    """The answer the events say."""
    start, finish = events[0], events[-1]
    assert isinstance(start, Started), start
    assert isinstance(finish, Finished), finish
    assert not any(isinstance(event, Started | Finished) for event in events[1:-1])
    parts: list[Text | Thinking | ToolCall] = []
    ended: set[int] = set()
    for event in events[1:-1]:
        if isinstance(event, PartStarted):
            assert event.index == len(parts), "parts are numbered in start order"
            parts.append(event.part)
            continue
        assert isinstance(event, PartEnded | TextDelta | ThinkingDelta | ArgumentsDelta)
        assert event.index < len(parts), f"{event} before its part"
        assert event.index not in ended, f"{event} after its part"
        if isinstance(event, PartEnded):
            ended.add(event.index)
        else:
            parts[event.index] = _grown(parts[event.index], event)
    assert ended == set(range(len(parts))), "every part ends"
    return Answer(start.answer_id, start.model, tuple(parts), finish.stop, finish.usage, finish.stop_sequence)
