"""Helpers for the Responses side's tests: Hypothesis strategies for the neutral requests and
answers the Responses API can express, an answer told as neutral stream events (its pieces cut at
drawn points, its parts interleaved), and openai-python's models to check what is written
against. Neutral events are assembled into their answer by tests.translate.chat_streams."""

from __future__ import annotations

import json
import string
from collections.abc import Iterable, Mapping
from itertools import pairwise
from typing import Any

from hypothesis import strategies as st
from openai.types.responses import Response, ResponseStreamEvent
from openai.types.responses.response_create_params import ResponseCreateParamsNonStreaming
from pydantic import TypeAdapter

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
    ToolDecl,
    ToolResult,
    Turn,
    Usage,
)
from gateway.translate.responses import ResponsesSide

CREATED_AT = 1_754_000_000
SIDE = ResponsesSide(clock=lambda: CREATED_AT)  # one time for a stream and its whole answer
STREAM_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
CREATE_PARAMS: TypeAdapter[Any] = TypeAdapter(ResponseCreateParamsNonStreaming)


def valid_request(body: Mapping[str, Any]) -> None:
    """A request openai-python's types take (its tools are checked lazily: consumed here)."""
    params = CREATE_PARAMS.validate_python({k: v for k, v in body.items() if k != "stream"})
    list(params.get("tools") or [])


def valid_response(body: Mapping[str, Any]) -> Response:
    return Response.model_validate(body)


# --- strategies ------------------------------------------------------------------------------------

names = st.text(string.ascii_letters + string.digits + "_-", min_size=1, max_size=20)
texts = st.text(max_size=40)
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                      max_size=3),
                           max_leaves=8)
arguments = st.dictionaries(names, json_values, max_size=3).map(json.dumps) | st.just("")
images = st.builds(Image, url=names.map(lambda path: f"https://example.com/{path}.png")) | st.builds(
    lambda data, kind: Image(data=data, media_type=kind),
    st.text(string.ascii_letters + string.digits + "+/=", max_size=30), st.sampled_from(["image/png", "image/jpeg"]))
results = st.builds(ToolResult, names, st.lists(st.builds(Text, texts) | images, max_size=3).map(tuple))
calls = st.builds(ToolCall, names, names, arguments)


@st.composite
def user_turns(draw: st.DrawFn) -> Turn:
    answered = draw(st.lists(results, max_size=3))
    said = draw(st.lists(st.builds(Text, texts) | images, min_size=0 if answered else 1, max_size=3))
    return Turn("user", (*answered, *said))


assistant_turns = st.lists(st.builds(Text, texts) | calls, min_size=1, max_size=4).map(
    lambda parts: Turn("assistant", tuple(parts)))


@st.composite
def conversations(draw: st.DrawFn) -> tuple[Turn, ...]:
    count = draw(st.integers(0, 5))
    return tuple(draw(user_turns() if i % 2 == 0 else assistant_turns) for i in range(count))


tool_decls = st.builds(ToolDecl, names, st.none() | texts, st.dictionaries(names, json_values, max_size=3))


@st.composite
def requests(draw: st.DrawFn) -> Request:
    """Neutral requests the Responses API can say whole (no thinking, stop sequences or error flags)."""
    tools = tuple(draw(st.lists(tool_decls, max_size=3)))
    choice = draw(st.none() | st.sampled_from(["auto", "none", "required"]) | names.map(lambda n: ("tool", n)))
    stream = draw(st.booleans())
    finite = st.floats(0, 2, allow_nan=False)
    return Request(model=draw(names), system=tuple(draw(st.lists(texts, max_size=3))), turns=draw(conversations()),
                   tools=tools, tool_choice=choice, parallel_tool_calls=draw(st.none() | st.booleans()),
                   max_tokens=draw(st.none() | st.integers(1, 10**6)), temperature=draw(st.none() | finite),
                   top_p=draw(st.none() | finite), stream=stream, stream_usage=stream,
                   user=draw(st.none() | names))


usages = st.just(Usage()) | st.builds(Usage, *(st.integers(0, 10**6) for _ in range(4)))


@st.composite
def answers(draw: st.DrawFn) -> Answer:
    """Neutral answers the Responses API can say whole: thinking without a signature, call ids
    unique (as a model makes them), a stop a response's status can tell."""
    kinds = draw(st.lists(st.sampled_from(["text", "thinking", "call"]), max_size=6))
    parts: list[Text | Thinking | ToolCall] = []
    for i, kind in enumerate(kinds):
        if kind == "text":
            parts.append(Text(draw(texts)))
        elif kind == "thinking":
            parts.append(Thinking(draw(texts)))
        else:
            parts.append(ToolCall(f"call_{i}_{draw(names)}", draw(names), draw(arguments)))
    called = any(isinstance(part, ToolCall) for part in parts)
    stop = draw(st.sampled_from(["tool_calls" if called else "end", "length", "content_filter"]))
    return Answer(f"resp_{draw(names)}", draw(names), tuple(parts), stop, draw(usages))


# --- streams ---------------------------------------------------------------------------------------

def _part_events(index: int, part: Text | Thinking | ToolCall, cuts: list[int]) -> list[StreamEvent]:
    if isinstance(part, ToolCall):
        whole, start = part.arguments, ToolCall(part.call_id, part.name, "")
    else:
        whole, start = part.text, type(part)("")
    bounds = sorted({0, len(whole), *(cut % (len(whole) + 1) for cut in cuts)})
    pieces = [whole[a:b] for a, b in pairwise(bounds)]
    made = {Text: lambda s: TextDelta(index, s), Thinking: lambda s: ThinkingDelta(index, s),
            ToolCall: lambda s: ArgumentsDelta(index, s)}[type(part)]
    return [PartStarted(index, start), *(made(piece) for piece in pieces), PartEnded(index)]


@st.composite
def told(draw: st.DrawFn, answer: Answer) -> list[StreamEvent]:
    """The answer as neutral stream events: each part's pieces cut at drawn points, the parts
    interleaved (started in their order), the input tokens told at the start."""
    queues = [_part_events(i, part, draw(st.lists(st.integers(0, 100), max_size=4)))
              for i, part in enumerate(answer.parts)]
    middle: list[StreamEvent] = []
    started = 0
    while any(queues):
        ready = [i for i in range(started + 1) if i < len(queues) and queues[i]]
        pick = draw(st.sampled_from(ready))
        started = max(started, pick + 1)
        middle.append(queues[pick].pop(0))
    opening = Usage(input_tokens=answer.usage.input_tokens)
    return [Started(answer.answer_id, answer.model, opening), *middle,
            Finished(answer.stop, answer.usage, answer.stop_sequence)]


def written(events: Iterable[StreamEvent]) -> list[dict[str, Any]]:
    writing = SIDE.stream_writing()
    return [out for event in events for out in writing.write(event)]


def in_order(events: list[dict[str, Any]]) -> None:
    """The order a Responses stream keeps: numbered from 0; opened, then items, then closed; each
    output item added once before anything is said of it and done once, nothing said of it after;
    each content part of a message likewise within its item."""
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert [event["type"] for event in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    items: dict[int, str] = {}  # output index -> added, done
    contents: dict[tuple[int, int], str] = {}
    for event in events[2:-1]:
        kind, where = event["type"], event["output_index"]
        if kind == "response.output_item.added":
            assert where == len(items), f"items are added once, numbered in order: {event}"
            items[where] = "added"
            continue
        assert items.get(where) == "added", f"{kind} on an item not open: {event}"
        if kind == "response.output_item.done":
            assert all(state == "done" for (at, _), state in contents.items() if at == where), event
            items[where] = "done"
        elif "content_index" in event:
            place = (where, event["content_index"])
            state = contents.get(place)
            assert state == (None if kind == "response.content_part.added" else "added"), event
            contents[place] = "done" if kind == "response.content_part.done" else "added"
    assert set(items.values()) <= {"done"}, "every item is done"


def read(events: Iterable[Mapping[str, Any]]) -> list[StreamEvent]:
    reading = SIDE.stream_reading()
    return [*(out for event in events for out in reading.read(event)), *reading.end()]


def sse(events: Iterable[Mapping[str, Any]]) -> bytes:
    return b"".join(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode() for event in events)
