"""Properties of the Chat side: whatever Chat can express comes back unchanged. A random neutral
request written as a Chat request and read back is the same request; a random answer written as a
chat.completion and read back is the same answer; and the same answer streamed, its texts and
arguments cut at random points, written as chunks (or as a provider might send them) and read
back, assembles into it too. Each written form goes through JSON on the way, as on the wire.

Within what Chat can express: no thinking in requests, tool results of text only and without an
error flag, no cache writes; an answer's reasoning before its text and its text before its calls
(Chat's message has one of each), and a stream-usage flag that follows `stream` (the Chat writer
always asks for the usage)."""

from __future__ import annotations

import string
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.translate.chat import CHAT
from gateway.translate.chat_stream import ChatStreamWriting
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
from tests.translate.chat_streams import assembled, read_chunks

texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)  # what JSON text can hold
said = texts.filter(bool)
names = st.text(string.ascii_letters + string.digits + "_-", min_size=1, max_size=10)
values = st.integers(-(2**53), 2**53) | texts  # JSON's numbers, as every parser keeps them
arguments = st.one_of(texts, st.dictionaries(names, values, max_size=3).map(
    lambda value: orjson.dumps(value).decode()))
calls = st.builds(ToolCall, names, names, arguments)
images = st.one_of(
    st.builds(Image, url=names.map(lambda name: f"https://example.com/{name}.png")),
    st.builds(Image, data=st.text(string.ascii_letters + string.digits + "+/=", max_size=16),
              media_type=st.sampled_from(["image/png", "image/jpeg", "image/webp"])))
results = st.builds(ToolResult, names, st.lists(st.builds(Text, texts), min_size=1, max_size=3).map(tuple))


def _wire(body: dict[str, Any]) -> dict[str, Any]:
    loaded: dict[str, Any] = orjson.loads(orjson.dumps(body))
    return loaded


@st.composite
def user_turns(draw: st.DrawFn) -> Turn:
    answered = draw(st.lists(results, max_size=3))
    rest = draw(st.lists(st.one_of(st.builds(Text, texts), images), min_size=0 if answered else 1, max_size=3))
    return Turn("user", (*answered, *rest))


@st.composite
def assistant_turns(draw: st.DrawFn) -> Turn:
    words = draw(st.lists(st.builds(Text, said), max_size=2))
    made = draw(st.lists(calls, min_size=0 if words else 1, max_size=3))
    return Turn("assistant", (*words, *made))


@st.composite
def requests(draw: st.DrawFn) -> Request:
    turns = [draw(user_turns() if i % 2 == 0 else assistant_turns()) for i in range(draw(st.integers(1, 5)))]
    tools = draw(st.lists(st.builds(ToolDecl, names, st.none() | texts,
                                    st.dictionaries(names, values, max_size=3)), max_size=3))
    choice = st.sampled_from(["auto", "none", "required"]) | names.map(lambda name: ("tool", name))
    stream = draw(st.booleans())
    return Request(
        model=draw(names), system=tuple(draw(st.lists(texts, max_size=3))), turns=tuple(turns), tools=tuple(tools),
        tool_choice=draw(st.none() | choice) if tools else None,
        parallel_tool_calls=draw(st.none() | st.booleans()) if tools else None,
        max_tokens=draw(st.none() | st.integers(1, 200_000)),
        temperature=draw(st.none() | st.floats(0, 2)), top_p=draw(st.none() | st.floats(0, 1)),
        stop=tuple(draw(st.lists(said, max_size=4))), stream=stream, stream_usage=stream, user=draw(st.none() | texts))


@settings(max_examples=300, deadline=None)
@given(request=requests())
def test_a_request_written_and_read_back_is_the_same(request: Request) -> None:
    body, dropped = CHAT.write_request(request)
    assert dropped == ()
    assert CHAT.read_request(_wire(body)) == request


@st.composite
def answers(draw: st.DrawFn) -> Answer:
    made = draw(st.lists(calls, max_size=3))
    parts = (*draw(st.lists(st.builds(Thinking, said), max_size=1)), *draw(st.lists(st.builds(Text, said), max_size=1)),
             *made)
    stop = draw(st.sampled_from(["tool_calls", "length", "content_filter", "stop_sequence"] if made else
                                ["end", "tool_calls", "length", "content_filter", "stop_sequence"]))
    counts = st.integers(0, 10**6)
    usage = draw(st.just(Usage()) | st.builds(Usage, counts, counts, st.none() | counts))
    return Answer(draw(names), draw(names), parts, stop, usage, draw(said) if stop == "stop_sequence" else None)


@settings(max_examples=300, deadline=None)
@given(answer=answers())
def test_an_answer_written_and_read_back_is_the_same(answer: Answer) -> None:
    assert CHAT.read_answer(_wire(CHAT.write_answer(answer))) == answer


def _cut(draw: st.DrawFn, text: str) -> list[str]:
    """`text` in pieces cut at random points (an empty piece now and then)."""
    points = sorted(draw(st.lists(st.integers(0, len(text)), max_size=4)))
    return [text[start:end] for start, end in zip([0, *points], [*points, len(text)], strict=True)]


@st.composite
def streamed(draw: st.DrawFn) -> tuple[Answer, list[StreamEvent]]:
    """An answer and neutral events that say it, its pieces cut anywhere."""
    answer = draw(answers())
    events: list[StreamEvent] = [Started(answer.answer_id, answer.model)]
    for index, part in enumerate(answer.parts):
        if isinstance(part, ToolCall):
            events.append(PartStarted(index, ToolCall(part.call_id, part.name, "")))
            events.extend(ArgumentsDelta(index, piece) for piece in _cut(draw, part.arguments))
        else:
            events.append(PartStarted(index, type(part)("")))
            delta = TextDelta if isinstance(part, Text) else ThinkingDelta
            events.extend(delta(index, piece) for piece in _cut(draw, part.text))
        events.append(PartEnded(index))
    events.append(Finished(answer.stop, answer.usage, answer.stop_sequence))
    return answer, events


@settings(max_examples=300, deadline=None)
@given(case=streamed())
def test_a_stream_written_and_read_back_assembles_into_the_answer(case: tuple[Answer, list[StreamEvent]]) -> None:
    answer, events = case
    writing = ChatStreamWriting()
    chunks = [_wire(chunk) for event in events for chunk in writing.write(event)]
    assert assembled(read_chunks(chunks)) == answer
    assert assembled(read_chunks(chunks)) == CHAT.read_answer(_wire(CHAT.write_answer(answer)))


@st.composite
def provider_streams(draw: st.DrawFn) -> tuple[Answer, list[dict[str, Any]]]:
    """An answer and chunks as different providers send it: the call's arguments whole with its
    name, or after an empty first fragment, or cut anywhere; the usage with the finish reason or in
    a chunk of its own; empty deltas between."""
    answer = draw(answers().filter(lambda answer: answer.stop != "stop_sequence"))
    head = {"id": answer.answer_id, "object": "chat.completion.chunk", "created": 1, "model": answer.model}
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": draw(st.sampled_from(["", None]))}]
    number = 0
    for part in answer.parts:
        if isinstance(part, ToolCall):
            pieces = draw(st.sampled_from([[part.arguments], ["", part.arguments], _cut(draw, part.arguments)]))
            deltas.append({"tool_calls": [{"index": number, "id": part.call_id, "type": "function",
                                           "function": {"name": part.name, "arguments": pieces[0]}}]})
            deltas.extend({"tool_calls": [{"index": number, "function": {"arguments": piece}}]} for piece in pieces[1:])
            number += 1
        else:
            key = "content" if isinstance(part, Text) else draw(st.sampled_from(["reasoning_content", "reasoning"]))
            deltas.extend({key: piece} for piece in _cut(draw, part.text))
        if draw(st.booleans()):
            deltas.append({"content": ""})
    chunks = [{**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]} for delta in deltas]
    finish = {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": CHAT.write_answer(answer)["choices"][0][
        "finish_reason"]}]}
    usage = CHAT.write_answer(answer).get("usage")
    if usage is not None and draw(st.booleans()):
        chunks += [{**finish, "usage": usage}]
    else:
        chunks += [finish, *([{**head, "choices": [], "usage": usage}] if usage is not None else [])]
    return answer, chunks


@settings(max_examples=300, deadline=None)
@given(case=provider_streams())
def test_a_providers_stream_however_it_is_cut_assembles_into_the_answer(
        case: tuple[Answer, list[dict[str, Any]]]) -> None:
    answer, chunks = case
    assert assembled(read_chunks(chunks)) == answer
