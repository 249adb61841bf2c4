"""Neutral requests, answers and streamed answers within what the Messages API can say, for the
Messages side's properties (tests/translate/test_messages*.py), and the helpers that read them."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from gateway.translate.neutral import (
    Answer,
    ArgumentsDelta,
    Finished,
    Image,
    PartEnded,
    PartStarted,
    Request,
    Started,
    StreamEvent,
    Text,
    TextDelta,
    Thinking,
    ThinkingDelta,
    ToolCall,
    ToolChoice,
    ToolDecl,
    ToolResult,
    Turn,
    Usage,
)
from gateway.translate.sides import StreamReading
from tests.apis.conftest import _pieces

CORPUS = Path(__file__).parent.parent / "corpus"
TEXT = st.text(st.characters(codec="utf-8"), min_size=1, max_size=30)
NAME = st.from_regex(r"[a-zA-Z0-9_-]{1,20}", fullmatch=True)
CALL_ID = st.one_of(st.from_regex(r"(toolu|call)_[a-zA-Z0-9]{1,12}", fullmatch=True),
                    st.text(max_size=20))  # any id another API may have given (`functions.f:0`)
SIGNATURE = st.from_regex(r"[A-Za-z0-9+/]{4,40}={0,2}", fullmatch=True)
JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8)
ARGUMENTS = st.dictionaries(st.text(max_size=8), JSON_VALUE, max_size=4).map(
    lambda value: json.dumps(value, separators=(",", ":"), ensure_ascii=False))
IMAGE = st.one_of(
    st.builds(lambda data, kind: Image(data=data, media_type=kind), st.from_regex(r"[A-Za-z0-9+/]{4,24}={0,2}",
              fullmatch=True), st.sampled_from(["image/png", "image/jpeg", "image/gif", "image/webp"])),
    st.builds(lambda path: Image(url=f"https://images.example/{path}.png"), NAME))
CALL = st.builds(ToolCall, CALL_ID, NAME, ARGUMENTS)
SAID_THINKING = st.one_of(st.builds(Thinking, TEXT, SIGNATURE), st.builds(Thinking, TEXT, st.none(), st.just(True)))
RESULT = st.builds(ToolResult, CALL_ID, st.lists(st.one_of(st.builds(Text, TEXT), IMAGE), max_size=3).map(tuple),
                   st.booleans())


@st.composite
def turns(draw: st.DrawFn) -> tuple[Turn, ...]:
    """Alternating turns (Messages merges consecutive turns of one role), a user's tool results
    first in it (where Messages puts them)."""
    first = draw(st.sampled_from(["user", "assistant"]))
    said: list[Turn] = []
    for i in range(draw(st.integers(1, 6))):
        if (i % 2 == 0) == (first == "user"):
            results = draw(st.lists(RESULT, max_size=3))
            rest = draw(st.lists(st.one_of(st.builds(Text, TEXT), IMAGE), min_size=0 if results else 1, max_size=3))
            said.append(Turn("user", (*results, *rest)))
        else:
            parts = st.one_of(st.builds(Text, TEXT), SAID_THINKING, CALL)
            said.append(Turn("assistant", tuple(draw(st.lists(parts, min_size=1, max_size=4)))))
    return tuple(said)


TOOL = st.builds(ToolDecl, NAME, st.none() | TEXT, st.dictionaries(st.text(max_size=6), JSON_VALUE, max_size=2).map(
    lambda properties: {"type": "object", "properties": properties}))
# A choice and whether parallel calls are allowed, as Messages says both in one tool_choice: parallel
# calls are its default (None), `none` forbids every call, and "no parallel calls" needs a choice.
CHOICE: st.SearchStrategy[tuple[ToolChoice | None, bool | None]] = st.one_of(
    st.tuples(st.none(), st.none()),
    st.tuples(st.sampled_from(["auto", "required"]) | st.tuples(st.just("tool"), NAME), st.sampled_from([None, False])),
    st.tuples(st.just("none"), st.none()))


@st.composite
def requests(draw: st.DrawFn) -> Request:
    choice, parallel = draw(CHOICE)
    stream = draw(st.booleans())
    unit = st.none() | st.floats(0, 1)
    return Request(draw(NAME), draw(st.lists(TEXT, max_size=1).map(tuple)), draw(turns()),
                   tuple(draw(st.lists(TOOL, max_size=3))), choice, parallel, draw(st.integers(1, 64000)),
                   draw(unit), draw(unit), tuple(draw(st.lists(TEXT, max_size=3))), stream, stream,
                   draw(st.none() | TEXT))


@st.composite
def usages(draw: st.DrawFn) -> Usage:
    """Token counts as Anthropic says them: its input count is what the cache neither read nor wrote."""
    read, written = (draw(st.none() | st.integers(0, 10**6)) for _ in range(2))
    return Usage(draw(st.integers(0, 10**6)) + (read or 0) + (written or 0), draw(st.integers(0, 10**6)), read,
                 written)


ANSWER_THINKING = st.one_of(st.builds(Thinking, st.text(max_size=30), st.none() | SIGNATURE),
                            st.builds(Thinking, st.text(max_size=30), st.none(), st.just(True)))
answers = st.builds(
    Answer, NAME, NAME,
    st.lists(st.one_of(st.builds(Text, st.text(max_size=30)), ANSWER_THINKING, CALL), max_size=5).map(tuple),
    st.sampled_from(["end", "tool_calls", "length", "stop_sequence", "content_filter"]), usages(),
    st.none() | TEXT)


def _part_events(draw: st.DrawFn, index: int, part: Text | Thinking | ToolCall) -> list[StreamEvent]:
    """One part's events: its empty start, its text cut anywhere, its end."""
    cuts = st.lists(st.integers(min_value=0), max_size=5)
    if isinstance(part, Text):
        return [PartStarted(index, Text("")), *(TextDelta(index, p) for p in _pieces(part.text, draw(cuts))),
                PartEnded(index)]
    if isinstance(part, ToolCall):
        empty = part.arguments == "{}" and draw(st.booleans())  # no arguments said at all: `{}`
        pieces = [] if empty else _pieces(part.arguments, draw(cuts))
        return [PartStarted(index, ToolCall(part.call_id, part.name, "")),
                *(ArgumentsDelta(index, p) for p in pieces), PartEnded(index)]
    signature = [ThinkingDelta(index, signature=p) for p in _pieces(part.signature or "", draw(cuts)) if p]
    return [PartStarted(index, Thinking("", redacted=part.redacted)),
            *(ThinkingDelta(index, p) for p in _pieces(part.text, draw(cuts))), *signature, PartEnded(index)]


@st.composite
def streamed(draw: st.DrawFn) -> tuple[Answer, list[StreamEvent]]:
    """An answer and a neutral stream of it, its parts interleaved as a Chat stream's parallel calls
    may be (each part starting after the ones before it have started)."""
    answer = draw(answers)
    queues = [_part_events(draw, i, part) for i, part in enumerate(answer.parts)]
    events: list[StreamEvent] = []
    while any(queues):
        ready = [i for i, queue in enumerate(queues) if queue and not (
            isinstance(queue[0], PartStarted) and any(isinstance(q[0], PartStarted) for q in queues[:i] if q))]
        events.append(queues[draw(st.sampled_from(ready))].pop(0))
    usage = answer.usage
    opening = draw(st.sampled_from([Usage(), Usage(usage.input_tokens, None, usage.cache_read_tokens,
                                                   usage.cache_write_tokens)]))
    return answer, [Started(answer.answer_id, answer.model, opening), *events,
                    Finished(answer.stop, usage, answer.stop_sequence)]


def assembled(events: Iterable[StreamEvent]) -> Answer:
    """The answer a neutral stream says: each part from its start and pieces, in index order."""
    opening: Started | None = None
    parts: dict[int, list[Any]] = {}
    for event in events:
        if isinstance(event, Started):
            opening = event
        elif isinstance(event, PartStarted):
            part = event.part
            parts[event.index] = [part, part.text if isinstance(part, Text | Thinking) else part.arguments,
                                  part.signature if isinstance(part, Thinking) else None]
        elif isinstance(event, TextDelta | ArgumentsDelta):
            parts[event.index][1] += event.text if isinstance(event, TextDelta) else event.json
        elif isinstance(event, ThinkingDelta):
            parts[event.index][1] += event.text
            if event.signature:
                parts[event.index][2] = (parts[event.index][2] or "") + event.signature
        elif isinstance(event, Finished):
            assert opening is not None
            return Answer(opening.answer_id, opening.model, tuple(_whole(*parts[i]) for i in sorted(parts)),
                          event.stop, event.usage, event.stop_sequence)
    raise AssertionError("the stream never finished")


def _whole(part: Text | Thinking | ToolCall, said: str, signature: str | None) -> Text | Thinking | ToolCall:
    if isinstance(part, Text):
        return Text(said)
    if isinstance(part, ToolCall):
        return ToolCall(part.call_id, part.name, said)
    return Thinking(said, signature, part.redacted)


def read_stream(reading: StreamReading, events: Sequence[dict[str, Any]]) -> list[StreamEvent]:
    return [*(said for event in events for said in reading.read(event)), *reading.end()]


def over_the_wire(value: Any) -> Any:
    """`value` as the other end of a connection reads it."""
    return json.loads(json.dumps(value))
