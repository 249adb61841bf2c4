"""Streamed Chat answers (gateway.translate.chat_stream): chunks read into neutral events, with
tool-call arguments split at every point, sent whole or after an empty first fragment, parallel
calls interleaved; neutral events written as chunks; and the recorded streams of tests/corpus,
each read into the same answer as its recorded JSON twin."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.errors import UpstreamUnavailable
from gateway.translate.chat import CHAT
from gateway.translate.chat_stream import ChatStreamWriting
from gateway.translate.neutral import (
    Answer,
    ArgumentsDelta,
    Finished,
    PartEnded,
    PartStarted,
    Started,
    Text,
    TextDelta,
    Thinking,
    ThinkingDelta,
    ToolCall,
    Usage,
)
from tests.conftest import _feed
from tests.translate.chat_streams import assembled, read_chunks
from tests.translate.test_chat import CORPUS, RECORDED

ARGUMENTS = '{"city": "Paris", "unit": "°C"}'


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **top: Any) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    return {"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice],
            **top}


def call(index: int | None, arguments: str | None = None, *, id: str | None = None, name: str | None = None,
         type: str | None = None) -> dict[str, Any]:
    """A tool-call fragment of a delta: only what is given (None: the key is absent)."""
    function = {key: value for key, value in (("name", name), ("arguments", arguments)) if value is not None}
    fragment = {key: value for key, value in (("index", index), ("id", id), ("type", type), ("function", function))
                if value not in (None, {})}
    return fragment


USAGE = {"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
         "usage": {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42}}


def _one_call(fragments: list[str], first: str | None) -> Answer:
    """A stream of one call: `first` is what its opening fragment carries as arguments (None: no
    arguments key), `fragments` the arguments after."""
    chunks = [chunk({"role": "assistant", "content": None}),
              chunk({"tool_calls": [call(0, first, id="call_1", type="function", name="weather")]}),
              *(chunk({"tool_calls": [call(0, piece)]}) for piece in fragments),
              chunk(finish="tool_calls"), USAGE]
    return assembled(read_chunks(chunks))


EXPECTED_CALL = Answer("chatcmpl-9", "m", (ToolCall("call_1", "weather", ARGUMENTS),), "tool_calls", Usage(30, 12))


@pytest.mark.parametrize("first", ["", None], ids=["empty-first", "no-arguments-first"])
def test_arguments_split_at_every_point_assemble_once(first: str | None) -> None:
    for cut in range(len(ARGUMENTS) + 1):
        assert _one_call([ARGUMENTS[:cut], ARGUMENTS[cut:]], first) == EXPECTED_CALL, cut
        for second in range(cut, len(ARGUMENTS) + 1):
            pieces = [ARGUMENTS[:cut], ARGUMENTS[cut:second], ARGUMENTS[second:]]
            assert _one_call(pieces, first) == EXPECTED_CALL, (cut, second)
    assert _one_call(list(ARGUMENTS), first) == EXPECTED_CALL  # a character a chunk


def test_arguments_begun_in_the_opening_fragment_at_every_point() -> None:
    for cut in range(len(ARGUMENTS) + 1):
        assert _one_call([ARGUMENTS[cut:]], ARGUMENTS[:cut]) == EXPECTED_CALL, cut


def test_whole_arguments_in_the_opening_fragment_are_one_delta() -> None:
    events = read_chunks([chunk({"tool_calls": [call(0, ARGUMENTS, id="call_1", name="weather")]}),
                          chunk(finish="tool_calls"), USAGE])
    assert events == [Started("chatcmpl-9", "m"), PartStarted(0, ToolCall("call_1", "weather", "")),
                      ArgumentsDelta(0, ARGUMENTS), PartEnded(0), Finished("tool_calls", Usage(30, 12))]


def test_arguments_sent_as_an_object_are_json_text() -> None:
    fragment = {"index": 0, "id": "c", "function": {"name": "f", "arguments": {"a": [1, 2]}}}
    events = read_chunks([chunk({"tool_calls": [fragment]}), chunk(finish="tool_calls")])
    assert assembled(events).parts == (ToolCall("c", "f", '{"a":[1,2]}'),)


def test_parallel_calls_interleaved_are_each_their_own_part() -> None:
    events = read_chunks([
        chunk({"role": "assistant", "content": "Checking both."}),
        chunk({"tool_calls": [call(0, "", id="call_a", name="weather"), call(1, '{"ci', id="call_b", name="weather")]}),
        chunk({"tool_calls": [call(1, 'ty": "Rome"}')]}),
        chunk({"tool_calls": [call(0, '{"city": "Paris"}')]}),
        chunk(finish="tool_calls"), USAGE])
    assert events == [
        Started("chatcmpl-9", "m"), PartStarted(0, Text("")), TextDelta(0, "Checking both."), PartEnded(0),
        PartStarted(1, ToolCall("call_a", "weather", "")), PartStarted(2, ToolCall("call_b", "weather", "")),
        ArgumentsDelta(2, '{"ci'), ArgumentsDelta(2, 'ty": "Rome"}'), ArgumentsDelta(1, '{"city": "Paris"}'),
        PartEnded(1), PartEnded(2), Finished("tool_calls", Usage(30, 12))]


def test_reasoning_then_text_then_a_call_then_text_again_are_four_parts() -> None:
    events = read_chunks([
        chunk({"role": "assistant", "content": "", "reasoning_content": ""}),
        chunk({"content": None, "reasoning_content": "Think"}), chunk({"reasoning": "ing."}),
        chunk({"content": "Let me ", "reasoning_content": None}), chunk({"content": "see."}),
        chunk({"tool_calls": [call(0, "{}", id="c1", name="look")]}),
        chunk({"content": "Done."}), chunk(finish="tool_calls")])
    assert events[:10] == [
        Started("chatcmpl-9", "m"), PartStarted(0, Thinking("")), ThinkingDelta(0, "Think"), ThinkingDelta(0, "ing."),
        PartEnded(0), PartStarted(1, Text("")), TextDelta(1, "Let me "), TextDelta(1, "see."), PartEnded(1),
        PartStarted(2, ToolCall("c1", "look", ""))]
    assert assembled(events).parts == (Thinking("Thinking."), Text("Let me see."), ToolCall("c1", "look", "{}"),
                                       Text("Done."))


def test_the_end_is_known_only_when_the_stream_ends() -> None:
    reading = CHAT.stream_reading()
    read = [event for c in (chunk({"role": "assistant", "content": "Hi"}), chunk(finish="stop")) for event in
            reading.read(c)]
    assert read == [Started("chatcmpl-9", "m"), PartStarted(0, Text("")), TextDelta(0, "Hi"), PartEnded(0)]
    assert reading.read(USAGE) == []
    assert reading.end() == [Finished("end", Usage(30, 12))]


def test_a_call_without_an_index_and_a_name_after_its_id() -> None:
    events = read_chunks([
        chunk({"tool_calls": [call(None, '{"a"', id="c1")]}), chunk({"tool_calls": [call(None, ":1}", name="f")]}),
        chunk({"tool_calls": [call(None, "{}", id="c2", name="g")]}), chunk(finish="stop")])
    answer = assembled(events)
    assert answer.parts == (ToolCall("c1", "f", '{"a":1}'), ToolCall("c2", "g", "{}"))
    assert answer.stop == "tool_calls"  # "stop" with calls: the calls tell


def test_a_stop_sequence_named_by_vllm_and_usage_with_the_finish() -> None:
    finish = chunk({"content": ""}, "stop", usage={"prompt_tokens": 3, "completion_tokens": 1,
                                                   "prompt_tokens_details": {"cached_tokens": 2}})
    finish["choices"][0]["stop_reason"] = "###"
    events = read_chunks([chunk({"content": "x"}), finish])
    assert events[-1] == Finished("stop_sequence", Usage(3, 1, 2), "###")


@pytest.mark.parametrize(("chunks", "said"), [
    ([chunk({"content": "x"})], "ended without a finish reason"),
    ([], "ended without a finish reason"),
    ([{"id": "x", "choices": "none"}], "choices are not a list"),
    ([{"id": "x", "choices": ["x"]}], "without a delta object"),
    ([chunk({"content": 5})], "content is not text"),
    ([chunk({"tool_calls": {"index": 0}})], "tool_calls that are not a list"),
    ([chunk({"tool_calls": [call(0, "{}", id="c")]}), chunk(finish="tool_calls")], "a tool call without a function"),
], ids=["no-finish", "empty", "choices-not-list", "choice-not-object", "content-a-number", "calls-not-list",
        "call-never-named"])
def test_a_stream_of_the_wrong_shape_is_the_providers_fault(chunks: list[dict[str, Any]], said: str) -> None:
    with pytest.raises(UpstreamUnavailable, match=said):
        read_chunks(chunks)


# --- writing -------------------------------------------------------------------------------------

EVENTS = [Started("msg_1", "claude", Usage(input_tokens=40)), PartStarted(0, Thinking("")),
          ThinkingDelta(0, "Hmm."), ThinkingDelta(0, signature="sig"), PartEnded(0),
          PartStarted(1, Text("")), TextDelta(1, "Looking."), PartEnded(1),
          PartStarted(2, ToolCall("toolu_a", "weather", "")), PartStarted(3, ToolCall("toolu_b", "now", "")),
          ArgumentsDelta(2, '{"city":'), ArgumentsDelta(3, "{}"), ArgumentsDelta(2, '"Paris"}'),
          PartEnded(2), PartEnded(3), Finished("tool_calls", Usage(40, 9, cache_read_tokens=32))]


def test_neutral_events_are_written_as_chunks() -> None:
    chunks = _written(EVENTS)
    heads = {(c.pop("id"), c.pop("object"), c.pop("model")) for c in chunks}
    assert heads == {("msg_1", "chat.completion.chunk", "claude")}
    assert len({c.pop("created") for c in chunks}) == 1

    def delta(d: dict[str, Any]) -> dict[str, Any]:
        return {"choices": [{"index": 0, "delta": d, "finish_reason": None}]}

    assert chunks == [
        delta({"role": "assistant", "content": ""}), delta({"reasoning_content": "Hmm."}),
        delta({"content": "Looking."}),
        delta({"tool_calls": [{"index": 0, "id": "toolu_a", "type": "function",
                               "function": {"name": "weather", "arguments": ""}}]}),
        delta({"tool_calls": [{"index": 1, "id": "toolu_b", "type": "function",
                               "function": {"name": "now", "arguments": ""}}]}),
        delta({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
        delta({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}),
        delta({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 9, "total_tokens": 49,
                                  "prompt_tokens_details": {"cached_tokens": 32}}}]


def _written(events: list[Any], usage_chunk: bool = True) -> list[dict[str, Any]]:
    writing = ChatStreamWriting(usage_chunk)
    return [json.loads(json.dumps(c)) for event in events for c in writing.write(event)]


def test_written_chunks_read_back_into_the_same_answer() -> None:
    answer = assembled(read_chunks(_written(EVENTS)))
    assert answer == Answer("msg_1", "claude", (Thinking("Hmm."), Text("Looking."),
                                               ToolCall("toolu_a", "weather", '{"city":"Paris"}'),
                                               ToolCall("toolu_b", "now", "{}")),
                            "tool_calls", Usage(40, 9, 32))


def test_no_usage_chunk_when_the_client_did_not_ask_or_nothing_is_known() -> None:
    assert _written(EVENTS, usage_chunk=False)[-1]["choices"][0]["finish_reason"] == "tool_calls"
    quiet = [Started("a", "m"), Finished("stop_sequence", stop_sequence="END")]
    assert [c["choices"] for c in _written(quiet)] == [
        [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
        [{"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": "END"}]]


# --- the recorded streams ------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(RECORDED))
def test_a_recorded_stream_reads_into_the_answer_of_its_json_twin(name: str) -> None:
    events = read_chunks(_feed([(CORPUS / f"{name}.sse").read_bytes()]))
    streamed = assembled(events)
    assert streamed == CHAT.read_answer(json.loads((CORPUS / f"{name}.json").read_text()))
    text, calls, thinking, stop, usage = RECORDED[name]
    assert streamed.parts == (*([Thinking(thinking)] if thinking else []), *([Text(text)] if text else []), *calls)
    assert (streamed.stop, streamed.usage) == (stop, usage)


def test_vllms_continuous_usage_gives_the_input_at_the_start_and_the_last_count_at_the_end() -> None:
    events = read_chunks(_feed([(CORPUS / "vllm_continuous_usage.sse").read_bytes()]))
    assert events[0] == Started("chatcmpl-8a41c0e2d9b74f5e86a3c1d0b2e9f7a4", "Qwen/Qwen3-8B", Usage(input_tokens=14))
    assert events[-1] == Finished("end", Usage(14, 9))


def test_azures_opening_chunk_without_an_id_does_not_start_the_answer() -> None:
    chunks = _feed([(CORPUS / "azure_content_filter.sse").read_bytes()])
    reading = CHAT.stream_reading()
    assert reading.read(chunks[0]) == []
    assert reading.read(chunks[1]) == [Started("chatcmpl-BlUq0s3kLwM8fXc2ZyN5vT1hJpQe7", "gpt-4o-2024-11-20")]
