"""The Responses side's answers and streams (gateway.translate.responses): the neutral answer
written as the response object and the event stream a Responses client reads (checked against
openai-python's models, and read by the real `openai` client over HTTP), and a Responses
provider's answers and streams read back (the recorded ones of tests/corpus included)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp import web
from openai.lib.streaming.responses import ResponseStreamState
from pytest_aiohttp import AiohttpServer

from gateway.errors import UpstreamUnavailable
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
from gateway.translate.responses import RESPONSES
from tests.translate.chat_streams import assembled
from tests.translate.responses_cases import (
    CREATED_AT,
    SIDE,
    STREAM_EVENT,
    in_order,
    read,
    sse,
    valid_response,
    written,
)

CORPUS = Path(__file__).parents[1] / "corpus"
MIXED = Answer("chatcmpl-9", "llama-3", (
    Thinking("Add first."), Text("Adding"), Text(" now."), ToolCall("call_1", "add", '{"a":2,"b":3}'),
    ToolCall("call_2", "add", '{"a":4,"b":5}')), "tool_calls", Usage(20, 9, 4, 0))


def corpus_events(name: str) -> list[dict[str, Any]]:
    lines = (CORPUS / name).read_text().splitlines()
    return [json.loads(line.removeprefix("data:")) for line in lines if line.startswith("data:")]


def test_an_answer_written_as_a_response() -> None:
    body = SIDE.write_answer(MIXED)
    assert {key: body[key] for key in ("id", "object", "created_at", "status", "incomplete_details", "model")} == {
        "id": "resp_chatcmpl-9", "object": "response", "created_at": CREATED_AT, "status": "completed",
        "incomplete_details": None, "model": "llama-3"}
    assert body["output"] == [
        {"type": "reasoning", "id": "rs_chatcmpl-9_0", "summary": [{"type": "summary_text", "text": "Add first."}]},
        {"type": "message", "id": "msg_chatcmpl-9_1", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Adding", "annotations": []},
                     {"type": "output_text", "text": " now.", "annotations": []}]},
        {"type": "function_call", "id": "fc_call_1", "call_id": "call_1", "name": "add", "arguments": '{"a":2,"b":3}',
         "status": "completed"},
        {"type": "function_call", "id": "fc_call_2", "call_id": "call_2", "name": "add", "arguments": '{"a":4,"b":5}',
         "status": "completed"}]
    assert body["usage"] == {"input_tokens": 20, "input_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 0},
                             "output_tokens": 9, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 29}
    response = valid_response(body)
    assert response.output_text == "Adding now."
    assert RESPONSES.read_answer(body) == replace(MIXED, answer_id="resp_chatcmpl-9")


@pytest.mark.parametrize(("stop", "reason"), [("length", "max_output_tokens"), ("content_filter", "content_filter")])
def test_an_answer_cut_short_is_an_incomplete_response(stop: Any, reason: str) -> None:
    body = RESPONSES.write_answer(Answer("resp_1", "m", (Text("Once upon"),), stop))
    assert (body["status"], body["incomplete_details"], body["usage"]) == ("incomplete", {"reason": reason}, None)
    valid_response(body)
    assert RESPONSES.read_answer(body).stop == stop


def test_redacted_thinking_is_not_shown() -> None:
    body = RESPONSES.write_answer(Answer("resp_1", "claude", (Thinking("EqQB...", redacted=True), Text("hi")), "end"))
    assert [item["type"] for item in body["output"]] == ["message"]
    assert body["output"][0]["id"] == "msg_1_0"


def test_a_recorded_openai_response_is_read() -> None:
    body = json.loads((CORPUS / "openai_responses_reasoning.json").read_text())
    assert RESPONSES.read_answer(body) == Answer(
        body["id"], "o4-mini-2025-04-16",
        (Thinking("**Comparing decimals**\n\nLooking at the tenths, 9.8 has 8 and 9.11 has 1, so 9.8 is larger."),
         Text("9.8 is larger.")), "end", Usage(31, 214, 0, None))


def test_a_summary_of_several_parts_is_one_thinking_whole_or_streamed() -> None:
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "First."},
                                                                {"type": "summary_text", "text": "Then."}]}
    done = {"id": "resp_1", "model": "m", "status": "completed", "output": [reasoning]}
    where = {"item_id": "rs_1", "output_index": 0}
    events = read([
        {"type": "response.created", "response": {**done, "status": "in_progress", "output": []}},
        {"type": "response.output_item.added", "output_index": 0, "item": {**reasoning, "summary": []}},
        *({"type": "response.reasoning_summary_part.added", **where, "summary_index": i,
           "part": {"type": "summary_text", "text": ""}} for i in range(2)),  # both open before any text
        {"type": "response.reasoning_summary_text.delta", **where, "summary_index": 0, "delta": "First."},
        {"type": "response.reasoning_summary_text.delta", **where, "summary_index": 1, "delta": "Then."},
        {"type": "response.output_item.done", "output_index": 0, "item": reasoning},
        {"type": "response.completed", "response": done}])
    assert assembled(events) == RESPONSES.read_answer(done) == Answer("resp_1", "m", (Thinking("First.\n\nThen."),),
                                                                      "end")


def test_a_call_whose_arguments_came_as_an_object_reads_as_json_text() -> None:
    body = {"id": "resp_1", "model": "m", "status": "completed", "output": [
        {"type": "function_call", "call_id": "c", "name": "add", "arguments": {"a": 1}}]}
    assert RESPONSES.read_answer(body).parts == (ToolCall("c", "add", '{"a":1}'),)


@pytest.mark.parametrize("body", [
    {"id": "resp_1", "model": "m", "status": "failed", "output": [], "error": {"code": "server_error",
                                                                             "message": "boom"}},
    {"id": "resp_1", "model": "m", "status": "in_progress", "output": []},
    {"id": "resp_1", "model": "m", "status": "completed"},
    {"id": "resp_1", "model": "m", "status": "completed", "output": [{"type": "function_call", "name": "f"}]},
    {"model": "m", "status": "completed", "output": []}])
def test_a_response_that_is_no_answer_is_the_provider_s_failure(body: dict[str, Any]) -> None:
    with pytest.raises(UpstreamUnavailable):
        RESPONSES.read_answer(body)


# --- streams ---------------------------------------------------------------------------------------

def test_a_stream_written_for_a_responses_client() -> None:
    events = written([
        Started("chatcmpl-9", "llama-3", Usage(input_tokens=20)), PartStarted(0, Text("")), TextDelta(0, "Add"),
        PartStarted(1, ToolCall("call_1", "add", "")), ArgumentsDelta(1, '{"a":'), TextDelta(0, "ing"),
        PartEnded(0), ArgumentsDelta(1, "2}"), PartEnded(1), Finished("tool_calls", Usage(output_tokens=9))])
    assert [(e["sequence_number"], e["type"], e.get("output_index")) for e in events] == [
        (0, "response.created", None), (1, "response.in_progress", None), (2, "response.output_item.added", 0),
        (3, "response.content_part.added", 0), (4, "response.output_text.delta", 0),
        (5, "response.output_item.added", 1), (6, "response.function_call_arguments.delta", 1),
        (7, "response.output_text.delta", 0), (8, "response.output_text.done", 0),
        (9, "response.content_part.done", 0), (10, "response.output_item.done", 0),  # another item has started
        (11, "response.function_call_arguments.delta", 1), (12, "response.function_call_arguments.done", 1),
        (13, "response.output_item.done", 1), (14, "response.completed", None)]
    in_order(events)
    for event in events:
        STREAM_EVENT.validate_python(event)
    assert (events[0]["response"]["status"], events[0]["response"]["output"]) == ("in_progress", [])
    final = events[-1]["response"]
    assert final == SIDE.write_answer(Answer("resp_chatcmpl-9", "llama-3", (
        Text("Adding"), ToolCall("call_1", "add", '{"a":2}')), "tool_calls", Usage(20, 9)))
    assert final["usage"]["total_tokens"] == 29  # the input tokens told at the start, the output at the end


def test_openai_python_s_stream_state_assembles_the_whole_response() -> None:
    events = written(_told(MIXED))
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=[], text_format=openai.omit)
    shown = [out for event in events for out in state.handle_event(STREAM_EVENT.validate_python(event))]
    assert "".join(e.delta for e in shown if e.type == "response.output_text.delta") == "Adding now."
    [completed] = [e for e in shown if e.type == "response.completed"]
    assert _unparsed(completed.response.model_dump()) == valid_response(SIDE.write_answer(MIXED)).model_dump()


def _unparsed(value: Any) -> Any:
    """A parsed response's dump without what the SDK's parsing adds (`parsed`, `parsed_arguments`)."""
    if isinstance(value, dict):
        return {k: _unparsed(v) for k, v in value.items() if k not in ("parsed", "parsed_arguments")}
    return [_unparsed(v) for v in value] if isinstance(value, list) else value


def _told(answer: Answer) -> list[Any]:
    events: list[Any] = [Started(answer.answer_id, answer.model)]
    for i, part in enumerate(answer.parts):
        if isinstance(part, ToolCall):
            events += [PartStarted(i, ToolCall(part.call_id, part.name, "")), ArgumentsDelta(i, part.arguments)]
        else:
            delta = TextDelta(i, part.text) if isinstance(part, Text) else ThinkingDelta(i, part.text)
            events += [PartStarted(i, type(part)("")), delta]
        events.append(PartEnded(i))
    return [*events, Finished(answer.stop, answer.usage)]


def test_a_recorded_openai_stream_reads_as_its_whole_response() -> None:
    body = json.loads((CORPUS / "openai_responses_reasoning.json").read_text())
    streamed = assembled(read(corpus_events("openai_responses_reasoning.sse")))
    assert streamed == RESPONSES.read_answer(body)


def test_a_stream_that_tells_its_items_only_whole_is_read() -> None:
    call = {"type": "function_call", "id": "fc_1", "call_id": "c", "name": "add", "arguments": '{"a":1}'}
    message = {"type": "message", "id": "m", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": "sum", "annotations": []}]}
    done = {"id": "resp_1", "model": "m", "status": "completed", "output": [message, call]}
    events = read([{"type": "response.created", "response": {**done, "status": "in_progress", "output": []}},
                   {"type": "response.output_item.done", "output_index": 0, "item": message},
                   {"type": "response.output_item.done", "output_index": 1, "item": call},
                   {"type": "response.completed", "response": done}])
    assert assembled(events) == Answer("resp_1", "m", (Text("sum"), ToolCall("c", "add", '{"a":1}')), "tool_calls")


@pytest.mark.parametrize("last", [
    {"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": "cut"},
    {"type": "response.failed", "response": {"id": "resp_1", "status": "failed", "error": {"message": "boom"}}},
    {"type": "error", "message": "overloaded"}])
def test_a_stream_cut_short_or_failed_is_the_provider_s_failure(last: dict[str, Any]) -> None:
    opened = {"type": "response.created", "response": {"id": "resp_1", "model": "m", "output": []}}
    with pytest.raises(UpstreamUnavailable):
        read([opened, last])


# --- the real openai client, over HTTP -------------------------------------------------------------

async def test_the_openai_client_reads_a_written_answer_and_stream(aiohttp_server: AiohttpServer) -> None:
    async def answer(request: web.Request) -> web.StreamResponse:
        if not (await request.json()).get("stream"):
            return web.json_response(SIDE.write_answer(MIXED))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(sse(written(_told(MIXED))))
        return response

    app = web.Application()
    app.router.add_post("/v1/responses", answer)
    server = await aiohttp_server(app)
    client = openai.AsyncOpenAI(base_url=str(server.make_url("/v1")), api_key="test", max_retries=0)
    whole = await client.responses.create(model="llama-3", input="add")
    assert whole.output_text == "Adding now."
    assert [(item.type, getattr(item, "call_id", None)) for item in whole.output] == [
        ("reasoning", None), ("message", None), ("function_call", "call_1"), ("function_call", "call_2")]
    async with client.responses.stream(model="llama-3", input="add") as stream:
        deltas = [event.delta async for event in stream if event.type == "response.output_text.delta"]
        final = await stream.get_final_response()
    assert "".join(deltas) == "Adding now."
    assert _unparsed(final.model_dump()) == whole.model_dump()
    await client.close()
