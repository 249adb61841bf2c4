"""Reading provider answers as turns: JSON and streams, Chat and Responses, and what a stream
shows the client at once."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.apis.chat.answer import ChatStreamReader, read_chat
from gateway.apis.responses.answer import ResponsesStreamReader, read_response
from gateway.apis.responses.render import visible_output
from gateway.engine.turn import summed_usage
from gateway.errors import UpstreamUnavailable


@pytest.mark.parametrize("body", [
    None, [], {}, {"choices": []}, {"choices": ["x"]}, {"choices": [{"message": "hi"}]},
    {"choices": [{"message": {"tool_calls": "x"}}]},
    {"choices": [{"message": {"tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}}]},
], ids=["null", "list", "empty", "no-choices", "choice-not-object", "message-not-object", "calls-not-list",
        "call-without-name"])
def test_a_chat_completion_of_the_wrong_shape_is_the_providers_fault(body: Any) -> None:
    with pytest.raises(UpstreamUnavailable, match="wrong shape"):
        read_chat(body)


@pytest.mark.parametrize("body", [
    None, {}, {"output": "x"}, {"output": ["x"]}, {"output": [{"type": "function_call", "call_id": "c"}]},
    {"output": [{"type": "custom_tool_call", "name": "g"}]},
], ids=["null", "no-output", "output-not-list", "item-not-object", "call-without-name", "custom-without-id"])
def test_a_response_of_the_wrong_shape_is_the_providers_fault(body: Any) -> None:
    with pytest.raises(UpstreamUnavailable, match="wrong shape"):
        read_response(body)


def test_arguments_sent_as_an_object_are_read_as_json_text() -> None:
    turn = read_chat({"choices": [{"message": {"tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1}}}]}}]})
    assert turn.calls[0].arguments == '{"a":1}'


@pytest.mark.parametrize(("status", "details", "calls", "reason"), [
    ("completed", None, False, "stop"),
    ("completed", None, True, "tool_calls"),
    ("incomplete", {"reason": "max_output_tokens"}, False, "max_output_tokens"),
    ("failed", None, False, "failed"),
])
def test_a_response_status_reads_as_a_finish_reason(status: str, details: Any, calls: bool, reason: str) -> None:
    output = [{"type": "function_call", "call_id": "c", "name": "add", "arguments": "{}"}] if calls else []
    turn = read_response({"status": status, "incomplete_details": details, "output": output,
                          "usage": {"input_tokens": 7, "output_tokens": 3}})
    assert turn.finish_reason == reason
    assert (turn.input_tokens, turn.output_tokens) == (7, 3)


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"id": "c-1", "created": 1, "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            **extra}


def test_a_chat_stream_shows_content_and_holds_calls_finish_and_usage() -> None:
    reader = ChatStreamReader()
    shown = [reader.absorb(c) for c in (
        chunk({"role": "assistant", "content": ""}, system_fingerprint="fp_1"),
        {**chunk({"content": "Hel"}), "choices": [{"index": 0, "delta": {"content": "Hel"}, "logprobs": {"content": []},
                                                   "finish_reason": None}]},
        chunk({"content": ""}),
        chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "add", "arguments": '{"a":'}}]}),
        chunk({"content": "lo", "tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
        chunk({}, "tool_calls"),
        {"id": "c-1", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}},
    )]
    assert shown[0] is not None
    assert shown[0]["system_fingerprint"] == "fp_1"  # the provider's fields stay
    assert shown[1] is not None
    assert shown[1]["choices"][0]["logprobs"] == {"content": []}
    assert [s is None for s in shown] == [False, False, True, True, False, True, True]
    assert shown[4] is not None
    assert shown[4]["choices"][0]["delta"] == {"content": "lo"}  # the call's fragment is held back
    turn = reader.turn()
    assert turn.output[0]["content"] == "Hello"
    assert [(c.name, c.arguments) for c in turn.calls] == [("add", '{"a":1}')]
    assert (turn.finish_reason, turn.input_tokens, turn.output_tokens) == ("tool_calls", 4, 2)


def test_a_chat_stream_without_a_finish_reason_was_cut_short() -> None:
    reader = ChatStreamReader()
    reader.absorb(chunk({"content": "Hel"}))
    with pytest.raises(UpstreamUnavailable, match="without a finish reason"):
        reader.turn()


def event(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "sequence_number": 0, **fields}


FINAL = {"id": "resp_1", "status": "completed", "output": [
    {"type": "message", "id": "msg_1", "role": "assistant", "content": [{"type": "output_text", "text": "Hi"}]},
    {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "add", "arguments": "{}"}]}


def test_a_responses_stream_shows_output_and_holds_calls_and_the_end() -> None:
    reader = ResponsesStreamReader()
    events = [
        event("response.created", response={"id": "resp_1", "output": []}),
        event("response.output_item.added", output_index=0, item={"type": "message", "id": "msg_1"}),
        event("response.output_text.delta", output_index=0, item_id="msg_1", delta="Hi"),
        event("response.output_item.added", output_index=1, item={"type": "function_call", "name": "add"}),
        event("response.function_call_arguments.delta", output_index=1, item_id="fc_1", delta="{}"),
        event("response.output_item.done", output_index=1, item=FINAL["output"][1]),
        {"no": "type"},
        event("response.completed", response=FINAL),
    ]
    shown = [reader.absorb(e) is not None for e in events]
    assert shown == [True, True, True, False, False, False, False, False]
    turn = reader.turn()
    assert [c.name for c in turn.calls] == ["add"]
    assert visible_output(turn) == [FINAL["output"][0]]


@pytest.mark.parametrize(("last", "message"), [
    (event("response.failed", response={"error": {"message": "overloaded"}}), "failed: overloaded"),
    (event("error", message="bad things"), "mid-stream: bad things"),
])
def test_a_responses_stream_that_fails_raises(last: dict[str, Any], message: str) -> None:
    with pytest.raises(UpstreamUnavailable, match=message):
        ResponsesStreamReader().absorb(last)


def test_a_responses_stream_without_its_end_was_cut_short() -> None:
    reader = ResponsesStreamReader()
    reader.absorb(event("response.created", response={"id": "resp_1"}))
    with pytest.raises(UpstreamUnavailable, match="before its response was complete"):
        reader.turn()


def test_an_incomplete_response_ends_the_stream_too() -> None:
    reader = ResponsesStreamReader()
    reader.absorb(event("response.incomplete", response={**FINAL, "status": "incomplete",
                                                         "incomplete_details": {"reason": "max_output_tokens"}}))
    assert reader.turn().finish_reason == "max_output_tokens"


def test_usage_sums_over_rounds_nested_details_included() -> None:
    turns = [read_response({"output": [], "usage": {"input_tokens": 3, "input_tokens_details": {"cached_tokens": 1}}}),
             read_response({"output": []}),
             read_response({"output": [], "usage": {"input_tokens": 4, "input_tokens_details": {"cached_tokens": 2},
                                                    "flag": True}})]
    assert summed_usage(turns) == {"input_tokens": 7, "input_tokens_details": {"cached_tokens": 3}}
    assert summed_usage(turns[1:2]) is None


def test_one_rounds_usage_is_the_providers_own() -> None:
    usage = {"input_tokens": 3, "output_tokens_details": {"reasoning_tokens": None}, "service_tier": "default",
             "cache_creation": None}
    [turn] = [read_response({"output": [], "usage": usage})]
    assert summed_usage([turn]) == usage
