"""Streamed Messages answers on the Messages side of translation: a provider's stream read into
neutral events (recorded streams, arguments cut at every point, the `{}` a tool_use block starts
with), neutral events written as the stream Anthropic's clients read, and that stream assembled by
the anthropic SDK itself into the message the answer is."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anthropic
import httpx2
import pytest
from hypothesis import given, settings

from gateway.errors import OVERLOADED, UpstreamUnavailable
from gateway.translate.messages import MESSAGES
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
from tests.conftest import _feed
from tests.translate.messages_cases import CORPUS, assembled, over_the_wire, read_stream, streamed

OPENING: dict[str, Any] = {"type": "message_start", "message": {
    "id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [], "stop_reason": None,
    "usage": {"input_tokens": 5, "output_tokens": 1}}}
CLOSING: list[dict[str, Any]] = [{"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": {"output_tokens": 9}}, {"type": "message_stop"}]
TOOL_START: dict[str, Any] = {"type": "content_block_start", "index": 0,
              "content_block": {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}}


def corpus_stream(name: str) -> list[dict[str, Any]]:
    return _feed([(CORPUS / f"anthropic_{name}.sse").read_bytes()])


def compact(answer: Answer) -> Answer:
    """The answer with its calls' arguments as compact JSON (a stream says them as the model
    spaced them; a whole message's `input` is an object)."""
    return Answer(answer.answer_id, answer.model, tuple(
        ToolCall(p.call_id, p.name, json.dumps(json.loads(p.arguments), separators=(",", ":"), ensure_ascii=False))
        if isinstance(p, ToolCall) else p for p in answer.parts), answer.stop, answer.usage, answer.stop_sequence)


def arguments_events(*pieces: str) -> list[dict[str, Any]]:
    deltas = [{"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": p}}
              for p in pieces]
    return [OPENING, TOOL_START, *deltas, {"type": "content_block_stop", "index": 0}, *CLOSING]


@pytest.mark.parametrize("name", ["text", "thinking", "tool_use", "redacted_thinking"])
def test_a_recorded_stream_reads_as_its_recorded_message(name: str) -> None:
    events = read_stream(MESSAGES.stream_reading(), corpus_stream(name))
    message = json.loads((CORPUS / f"anthropic_{name}.json").read_text())
    assert compact(assembled(events)) == MESSAGES.read_answer(message)
    assert isinstance(events[0], Started)
    assert events[0].usage == Usage(MESSAGES.read_answer(message).usage.input_tokens, None,
                                    message["usage"]["cache_read_input_tokens"],
                                    message["usage"]["cache_creation_input_tokens"])


def test_arguments_cut_at_every_point_read_once_without_the_starts_empty_object() -> None:
    said = '{"location": "San Francisco, CA", "unit": "fahrenheit"}'
    for cut in range(len(said) + 1):
        events = read_stream(MESSAGES.stream_reading(), arguments_events("", said[:cut], said[cut:]))
        pieces = [event.json for event in events if isinstance(event, ArgumentsDelta)]
        assert "".join(pieces) == said
        assert "" not in pieces
        assert events[1] == PartStarted(0, ToolCall("toolu_1", "f", ""))


@pytest.mark.parametrize("pieces", [(), ("",), ("", "")])
def test_a_call_whose_arguments_never_came_has_an_empty_object(pieces: tuple[str, ...]) -> None:
    events = read_stream(MESSAGES.stream_reading(), arguments_events(*pieces))
    assert events[1:4] == [PartStarted(0, ToolCall("toolu_1", "f", "")), ArgumentsDelta(0, "{}"), PartEnded(0)]


def test_a_call_said_whole_in_its_start_keeps_its_arguments() -> None:
    """Some compatible servers put the whole input in the block's start and send no delta."""
    whole = {**TOOL_START, "content_block": {**TOOL_START["content_block"], "input": {"city": "Lisbon"}}}
    events = read_stream(MESSAGES.stream_reading(), [OPENING, whole, {"type": "content_block_stop", "index": 0},
                                                     *CLOSING])
    assert [e for e in events if isinstance(e, ArgumentsDelta)] == [ArgumentsDelta(0, '{"city":"Lisbon"}')]


def test_a_server_tools_blocks_are_left_out_and_the_parts_counted_without_them() -> None:
    server = [{"type": "content_block_start", "index": 0, "content_block": {
                  "type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}},
              {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "{}"}},
              {"type": "content_block_stop", "index": 0},
              {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
              {"type": "content_block_delta", "index": 1, "delta": {"type": "citations_delta", "citation": {}}},
              {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Found."}},
              {"type": "content_block_stop", "index": 1}]
    events = read_stream(MESSAGES.stream_reading(), [OPENING, {"type": "ping"}, *server, *CLOSING])
    assert events[1:4] == [PartStarted(0, Text("")), TextDelta(0, "Found."), PartEnded(0)]
    assert events[-1] == Finished("tool_calls", Usage(5, 9))


@pytest.mark.parametrize(("events", "words"), [
    ([TOOL_START], "before message_start"),
    ([OPENING, {"type": "content_block_delta", "index": 3, "delta": {"type": "text_delta", "text": "x"}}],
     "never started"),
    ([OPENING, {"type": "content_block_stop", "index": 0}], "never started"),
    ([OPENING, {"type": "content_block_start", "content_block": {"type": "text"}}], "without its index"),
    ([OPENING, {"type": "message_stop"}], "without saying why"),
    ([OPENING, TOOL_START], "ended before its message was complete"),
    ([OPENING, OPENING], "twice"),
    ([OPENING, {**TOOL_START, "content_block": {"type": "tool_use", "input": {}}}], "without its id"),
])
def test_a_broken_stream_is_the_providers_fault(events: list[dict[str, Any]], words: str) -> None:
    with pytest.raises(UpstreamUnavailable, match=words):
        read_stream(MESSAGES.stream_reading(), events)


def test_an_overloaded_error_in_the_stream_keeps_its_529() -> None:
    [event] = [json.loads(line[len("data: "):]) for line in
               (CORPUS / "anthropic_error_overloaded.sse").read_text().splitlines() if line.startswith("data: ")]
    with pytest.raises(UpstreamUnavailable) as failed:
        MESSAGES.stream_reading().read(event)
    assert failed.value.status == OVERLOADED


def test_a_stream_cut_after_its_stop_reason_still_finishes() -> None:
    events = read_stream(MESSAGES.stream_reading(), arguments_events('{"a":1}')[:-1])
    assert events[-1] == Finished("tool_calls", Usage(5, 9))


# --- writing -----------------------------------------------------------------------------------------------

INTERLEAVED: list[StreamEvent] = [
    Started("msg_1", "m", Usage()), PartStarted(0, Thinking("")), ThinkingDelta(0, "hm"),
    PartStarted(1, ToolCall("call_a", "f", "")), ArgumentsDelta(1, '{"x"'),
    PartStarted(2, ToolCall("functions.g:1", "g", "")), ThinkingDelta(0, signature="c2ln"), ArgumentsDelta(1, ":1}"),
    ThinkingDelta(0, signature="bmVk"), PartEnded(2), PartStarted(3, Thinking("", redacted=True)),
    ThinkingDelta(3, "ZGF0"), PartEnded(0), ThinkingDelta(3, "YQ=="), PartEnded(1), PartEnded(3),
    Finished("tool_calls", Usage(120, 30, 100, None))]


def test_interleaved_parts_are_said_one_block_after_the_other() -> None:
    writing = MESSAGES.stream_writing()
    said = [event for neutral in INTERLEAVED for event in writing.write(neutral)]
    block = "content_block_start", "content_block_delta", "content_block_stop"
    start, delta, stop = ({"type": kind, "index": i} for kind, i in zip(block, (0, 0, 0), strict=True))
    assert said == [
        {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                                              "content": [], "stop_reason": None, "stop_sequence": None,
                                              "usage": {"input_tokens": 0, "output_tokens": 0}}},
        {**start, "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
        {**delta, "delta": {"type": "thinking_delta", "thinking": "hm"}},
        {**delta, "delta": {"type": "signature_delta", "signature": "c2lnbmVk"}}, stop,
        {"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "call_a", "name": "f",
                                                                      "input": {}}},
        *({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": p}}
          for p in ('{"x"', ":1}")),
        {"type": "content_block_stop", "index": 1},
        {"type": "content_block_start", "index": 2,
         "content_block": {"type": "tool_use", "id": "ts64_ZnVuY3Rpb25zLmc6MQ", "name": "g", "input": {}}},
        {"type": "content_block_stop", "index": 2},  # no arguments: no delta, and the SDK keeps `{}`
        {"type": "content_block_start", "index": 3, "content_block": {"type": "redacted_thinking", "data": "ZGF0YQ=="}},
        {"type": "content_block_stop", "index": 3},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
         "usage": {"input_tokens": 20, "output_tokens": 30, "cache_read_input_tokens": 100}},
        {"type": "message_stop"}]


def test_an_answer_ending_with_parts_open_closes_them() -> None:
    writing = MESSAGES.stream_writing()
    said = [event for neutral in (Started("a", "m"), PartStarted(0, Text("")), TextDelta(0, "hi"),
                                  PartStarted(1, Text("")), TextDelta(1, "there"), Finished("length"))
            for event in writing.write(neutral)]
    assert [(e["type"], e.get("index")) for e in said] == [
        ("message_start", None), ("content_block_start", 0), ("content_block_delta", 0), ("content_block_stop", 0),
        ("content_block_start", 1), ("content_block_delta", 1), ("content_block_stop", 1), ("message_delta", None),
        ("message_stop", None)]
    assert said[-2]["usage"] == {"output_tokens": 0}  # an input count nobody gave stays the opening's


@settings(max_examples=200, deadline=None)
@given(case=streamed())
def test_any_streamed_answer_written_and_read_back_is_the_answer(case: tuple[Answer, list[StreamEvent]]) -> None:
    answer, events = case
    writing = MESSAGES.stream_writing()
    said = over_the_wire([event for neutral in events for event in writing.write(neutral)])
    blocks = [e["index"] for e in said if e["type"] == "content_block_start"]
    assert blocks == list(range(len(answer.parts)))
    assert all(e["index"] == max(i for i in blocks if i <= e["index"]) for e in said if "index" in e)
    assert assembled(read_stream(MESSAGES.stream_reading(), said)) == answer


# --- the anthropic SDK assembles what was written ----------------------------------------------------------

def sse(events: list[dict[str, Any]]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


@contextmanager
def sdk() -> Iterator[tuple[anthropic.Anthropic, list[httpx2.Response]]]:
    """The anthropic client, its provider the next of `answers` (the edge: an HTTP transport)."""
    answers: list[httpx2.Response] = []
    transport = httpx2.MockTransport(lambda request: answers.pop(0))
    with anthropic.Anthropic(api_key="x", base_url="http://upstream.test", max_retries=0,
                             http_client=httpx2.Client(transport=transport)) as client:
        yield client, answers


def sdk_messages(client: anthropic.Anthropic, answers: list[httpx2.Response], answer: Answer,
                 said: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The message the SDK makes of the written answer, and the one it assembles from the stream."""
    answers += [httpx2.Response(200, json=MESSAGES.write_answer(answer)),
                httpx2.Response(200, content=sse(said), headers={"content-type": "text/event-stream"})]
    request: Any = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    whole = client.messages.create(**request)
    with client.messages.stream(**request) as stream:
        final = stream.get_final_message()
    return whole.model_dump(exclude_none=True), final.model_dump(exclude_none=True)


@settings(max_examples=60, deadline=None)
@given(case=streamed())
def test_the_sdk_assembles_a_written_stream_into_the_written_message(case: tuple[Answer, list[StreamEvent]]) -> None:
    answer, events = case
    writing = MESSAGES.stream_writing()
    with sdk() as (client, answers):
        whole, final = sdk_messages(client, answers, answer, [e for neutral in events for e in writing.write(neutral)])
    assert final == whole
    assert [b.get("input") for b in final["content"]] == [
        json.loads(p.arguments) if isinstance(p, ToolCall) else None for p in answer.parts]


def test_the_sdk_assembles_arguments_cut_at_every_point() -> None:
    arguments = '{"city":"Lisboa","days":[1,2],"units":{"t":"°C"}}'
    answer = Answer("msg_1", "m", (ToolCall("toolu_1", "f", arguments),), "tool_calls", Usage(3, 4))
    for cut in range(len(arguments) + 1):
        writing = MESSAGES.stream_writing()
        neutral: list[StreamEvent] = [Started("msg_1", "m"), PartStarted(0, ToolCall("toolu_1", "f", "")),
                   ArgumentsDelta(0, arguments[:cut]), ArgumentsDelta(0, arguments[cut:]), PartEnded(0),
                   Finished("tool_calls", Usage(3, 4))]
        with sdk() as (client, answers):
            whole, final = sdk_messages(client, answers, answer, [event for n in neutral for event in writing.write(n)])
        assert final == whole
        assert final["content"][0]["input"] == {"city": "Lisboa", "days": [1, 2], "units": {"t": "°C"}}


@pytest.mark.parametrize("name", ["text", "thinking", "tool_use", "redacted_thinking"])
def test_a_recorded_stream_read_and_written_reaches_the_sdk_as_its_recorded_message(name: str) -> None:
    writing = MESSAGES.stream_writing()
    said = [event for neutral in read_stream(MESSAGES.stream_reading(), corpus_stream(name))
            for event in writing.write(neutral)]
    recorded = json.loads((CORPUS / f"anthropic_{name}.json").read_text())
    with sdk() as (client, answers):
        answers.append(httpx2.Response(200, content=sse(said), headers={"content-type": "text/event-stream"}))
        with client.messages.stream(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}]) as stream:
            final = stream.get_final_message().model_dump(exclude_none=True)
    assert final["content"] == [{k: v for k, v in block.items() if k != "caller"} for block in recorded["content"]]
    assert {k: final[k] for k in ("id", "model", "stop_reason")} == {k: recorded[k] for k in ("id", "model",
                                                                                                 "stop_reason")}
    usage = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    assert {k: final["usage"][k] for k in usage} == {k: recorded["usage"][k] for k in usage}
