"""Reading a Responses API answer as a turn (gateway.apis.responses.answer): JSON and streams, and what
a stream shows the client at once."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.apis.responses.answer import ResponsesStreamReader, read_response
from gateway.apis.responses.render import visible_output
from gateway.errors import UpstreamUnavailable


@pytest.mark.parametrize("body", [
    None, {}, {"output": "x"}, {"output": ["x"]}, {"output": [{"type": "function_call", "call_id": "c"}]},
    {"output": [{"type": "custom_tool_call", "name": "g"}]},
], ids=["null", "no-output", "output-not-list", "item-not-object", "call-without-name", "custom-without-id"])
def test_a_response_of_the_wrong_shape_is_the_providers_fault(body: Any) -> None:
    with pytest.raises(UpstreamUnavailable, match="wrong shape"):
        read_response(body)


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
