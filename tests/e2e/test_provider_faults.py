"""A provider that sends what no real one does: tool-call arguments nested hundreds of levels deep,
one SSE event larger than any cap, in many small lines; and a burst of calls that leaves its
connections idle. Each ends in a clear answer (a 502 naming its limit), with its span and its
count, and the connections a burst opened are closed once idle."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.demo.model import Reply
from telemetry import names
from tests.conftest import AUTH, STREAM, USER, Stack, StackFactory
from tests.e2e.test_faults import assert_error_spans, assert_openai_error, ended, status_error, trace_of

DEPTH = 300  # past orjson's 255 levels, which it cannot encode again
DEADLINE = 10.0


def deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {"a": 1}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def chat_completion(arguments: Any) -> bytes:
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": arguments}}
    return json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                       "choices": [{"index": 0, "finish_reason": "tool_calls",
                                    "message": {"role": "assistant", "content": None, "tool_calls": [call]}}]}).encode()


def chat_chunk(arguments: Any) -> bytes:
    call = {"index": 0, "id": "c1", "type": "function", "function": {"name": "add", "arguments": arguments}}
    return json.dumps({"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
                       "choices": [{"index": 0, "finish_reason": "tool_calls",
                                    "delta": {"role": "assistant", "tool_calls": [call]}}]}).encode()


def response(arguments: Any) -> dict[str, Any]:
    item = {"type": "function_call", "id": "fc1", "call_id": "c1", "name": "add", "arguments": arguments,
            "status": "completed"}
    return {"id": "resp_1", "object": "response", "created_at": 0, "model": "m", "status": "completed",
            "output": [item]}


def requests_counted(stack: Stack, route: str, status: str) -> float:
    return stack.metric(names.METRIC_REQUESTS, **{names.LABEL_ROUTE: route, names.LABEL_STATUS: status})


# --- arguments nested past max_json_depth -----------------------------------------------------------


@STREAM
async def test_chat_arguments_nested_too_deep_are_a_502_naming_the_limit(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(raw=chat_chunk(deep(DEPTH)) if stream else chat_completion(deep(DEPTH))))
    exc = await status_error(stack.client, stream)
    assert exc.status_code == 502
    error = assert_openai_error(exc.response.json(), type_="upstream_error")
    assert "more than 64 levels deep (max_json_depth)" in error["message"]
    assert_error_spans(ended(stack, trace_of(exc), chats=1), 502, "upstream_error")
    assert requests_counted(stack, "/v1/chat/completions", "502") == 1
    assert len(stack.upstream_requests) == 1  # no second round was made of it


@STREAM
async def test_responses_arguments_nested_too_deep_are_a_502_naming_the_limit(stack: Stack, stream: bool) -> None:
    body = response(deep(DEPTH))
    if stream:
        done = {"type": "response.completed", "sequence_number": 1, "response": body}
        stack.script.then(Reply(raw_stream=b"data: " + json.dumps(done).encode() + b"\n\n"))
    else:
        stack.script.then(Reply(raw=json.dumps(body).encode()))
    async with stack.http.post("/v1/responses", json={"model": "m", "input": "hi", "stream": stream},
                               headers=AUTH) as answer:
        status, text = answer.status, await answer.text()
        trace_id = answer.headers["X-Trace-Id"]
    if stream and status == 200:  # the stream had begun: its last event says what went wrong
        events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
        message = events[-1]["response"]["error"]["message"] if "response" in events[-1] \
            else events[-1]["error"]["message"]
    else:
        assert status == 502
        message = assert_openai_error(json.loads(text), type_="upstream_error")["message"]
    assert "more than 64 levels deep (max_json_depth)" in message
    found = ended(stack, trace_id, chats=1)
    assert found["chat"][0].attributes is not None
    assert found["chat"][0].attributes[names.ATTR_ERROR_TYPE] == "upstream_error"
    assert requests_counted(stack, "/v1/responses", str(status)) == 1


async def test_arguments_as_deep_json_text_are_a_rejection_to_the_model(stack: Stack) -> None:
    """Text arguments (the API's own form) are the model's output, relayed as text: their depth is
    the tool's to judge, and the model is told, so it can call again."""
    stack.script.then(Reply(raw=chat_completion(json.dumps(deep(DEPTH)))), Reply(content="gave up"))
    answer = await stack.ask(False, messages=USER)
    assert answer.content == "gave up"
    [result] = [m for m in stack.upstream_requests[1]["messages"] if m["role"] == "tool"]
    assert "nested more than 64 levels deep" in result["content"]


# --- one SSE event past the cap, in lines each under it ------------------------------------------------


async def test_an_event_past_the_cap_in_many_short_lines_is_a_502(stack: Stack) -> None:
    """An event's data lines are joined into one payload: its size is capped as a whole, not line
    by line, or a provider could make the gateway buffer without bound."""
    chunk = json.loads(chat_chunk(None))
    chunk["choices"][0] = {"index": 0, "delta": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
    head, tail = json.dumps(chunk)[:-1].encode(), b"}"
    line = b'data: "' + b"x" * (1024 * 1024) + b'",\n'
    # A chunk the engine would take (17 MiB of padding beside its content), valid once its lines are joined.
    event = b"data: " + head + b', "padding": [\n' + line * 17 + b'data: "end"]' + tail + b"\n\ndata: [DONE]\n\n"
    stack.script.then(Reply(raw_stream=event))
    exc = await status_error(stack.client, True)
    assert exc.status_code == 502
    error = assert_openai_error(exc.response.json(), type_="upstream_error")
    assert "larger than 16 MiB" in error["message"]
    assert_error_spans(ended(stack, trace_of(exc), chats=1), 502, "upstream_error")


# --- idle connections -----------------------------------------------------------------------------


def established_to(port: int) -> int:
    """This process's TCP connections to `port` that are open (each holds a descriptor)."""
    count = 0
    for table in (Path("/proc/self/net/tcp"), Path("/proc/self/net/tcp6")):
        for row in table.read_text().splitlines()[1:]:
            fields = row.split()
            if int(fields[2].rsplit(":", 1)[1], 16) == port and fields[3] == "01":  # 01: ESTABLISHED
                count += 1
    return count


async def until_at_most(port: int, limit: int) -> int:
    """Polls (no event tells of a socket closed in the kernel) until at most `limit` connections to
    `port` are open, or the deadline passes; returns the last count."""
    deadline = time.monotonic() + DEADLINE
    while (found := established_to(port)) > limit and time.monotonic() < deadline:  # noqa: ASYNC110 (no event)
        await asyncio.sleep(0.05)
    return found


async def test_connections_left_idle_by_a_burst_are_closed(make_stack: StackFactory) -> None:
    stack = await make_stack(upstream_idle_seconds=0.5)
    assert stack.upstream_server is not None
    assert stack.upstream_server.port is not None
    port = stack.upstream_server.port
    before = established_to(port)
    burst = 40
    arrived: list[dict[str, Any]] = []
    all_in = asyncio.Event()

    async def together(body: dict[str, Any]) -> Reply:
        """Answers once the whole burst has arrived: each call then holds a connection of its own."""
        arrived.append(body)
        if len(arrived) == burst:
            all_in.set()
        await all_in.wait()
        return Reply(content="hi")

    stack.model.policy = together
    answers = await asyncio.gather(*(stack.ask(False, messages=USER) for _ in range(burst)))
    models = await asyncio.gather(*(stack.http.get("/v1/models", headers=AUTH) for _ in range(burst)))
    assert [a.content for a in answers] == ["hi"] * burst
    assert [m.status for m in models] == [200] * burst
    for m in models:
        m.release()
    assert established_to(port) >= before + burst  # the engine's own pool, and the pass-through's
    assert await until_at_most(port, before) <= before
    assert requests_counted(stack, "/v1/chat/completions", "200") == burst
    assert len([s for s in stack.spans() if s.parent is None]) == 2 * burst


async def test_a_deep_answer_does_not_cost_the_next_request(stack: Stack) -> None:
    stack.script.then(Reply(raw=chat_completion(deep(DEPTH))), Reply(content="fine"))
    with pytest.raises(openai.APIStatusError):
        await stack.ask(False, messages=USER)
    assert (await stack.ask(False, messages=USER)).content == "fine"
