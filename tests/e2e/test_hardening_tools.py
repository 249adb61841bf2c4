"""Hardening, the tool side (issue 10): odd text in a model's arguments, a caller's own custom
tools, arguments sent as an object in a stream, and the bounded thread pool for sync tools."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from gateway.demo.model import Reply
from gateway.tools import Param, Tool, ToolRegistry
from telemetry import names
from tests.conftest import (
    AUTH,
    STREAM,
    USER,
    StackFactory,
    sample_registry,
    tool_call_spans,
    tool_messages,
    tool_outcomes,
)


def sse(*events: dict[str, Any]) -> bytes:
    """A recorded stream: these events, as a provider writes them, then [DONE]."""
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-rec", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def completion(message: dict[str, Any], finish: str) -> bytes:
    return json.dumps({"id": "chatcmpl-rec", "object": "chat.completion", "created": 1, "model": "m",
                       "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                       "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()


async def chat(stack: Any, stream: bool, **request: Any) -> tuple[int, list[dict[str, Any]]]:
    """Raw HTTP to /v1/chat/completions: the status and the JSON body (or the stream's events)."""
    body = {"model": "m", "messages": USER, "stream": stream, **request}
    async with stack.http.post("/v1/chat/completions", json=body, headers=AUTH) as response:
        text = await response.text()
        if not stream:
            return response.status, [json.loads(text)]
        return response.status, [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


# --- item 4: a lone surrogate in the arguments, echoed by a tool --------------------------------------

def echo(args: dict[str, Any]) -> str:
    return str(args["text"])


def echo_registry() -> ToolRegistry:
    registry = sample_registry()
    registry.register(Tool(name="echo", function=echo, parameters=[Param("text", "string", required=True)]))
    return registry


LONE = '{"text": "a\\udcffb"}'  # JSON text: a lone low surrogate, as a JSON escape


def saw_replacement(body: dict[str, Any]) -> Reply:
    """The model's next turn: the echoed text reached it, with U+FFFD for the lone surrogate."""
    [result] = [m["content"] for m in body["messages"] if m.get("role") == "tool"]
    assert result == "a\ufffdb", result
    return Reply(content="echoed")


@STREAM
async def test_chat_a_lone_surrogate_echoed_by_a_tool_completes(make_stack: StackFactory, stream: bool) -> None:
    stack = await make_stack(registry=echo_registry())
    stack.script.then(Reply(tool_calls=[("echo", LONE)]), saw_replacement)
    answer = await stack.ask(stream, messages=USER)
    assert answer.content == "echoed"
    assert tool_messages(stack.upstream_requests[1])[0]["content"] == "a\ufffdb"
    trace = answer.headers["x-trace-id"]
    assert tool_outcomes(stack, trace) == [("echo", "ok")]


@STREAM
async def test_responses_a_lone_surrogate_echoed_by_a_tool_completes(make_stack: StackFactory, stream: bool) -> None:
    stack = await make_stack(registry=echo_registry())
    stack.script.then(Reply(tool_calls=[("echo", LONE)]), saw_replacement)
    answer = await stack.respond(stream, input="echo it")
    assert answer.text == "echoed"
    [output] = [i for i in stack.upstream_requests[1]["input"] if i.get("type") == "function_call_output"]
    assert output["output"] == "a\ufffdb"


# --- item 5: the caller's own custom (free-form) tools --------------------------------------------------

GRAMMAR = {"type": "custom", "custom": {"name": "grammar", "description": "SQL in a grammar"}}
CUSTOM_CALL = {"id": "call_c1", "type": "custom", "custom": {"name": "grammar", "input": "SELECT 1"}}


async def test_chat_a_custom_call_reaches_the_client(make_stack: StackFactory) -> None:
    stack = await make_stack()
    stack.script.then(Reply(raw=completion({"role": "assistant", "content": None, "tool_calls": [CUSTOM_CALL]},
                                           "tool_calls")))
    status, [body] = await chat(stack, False, tools=[GRAMMAR])
    assert status == 200, body
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"] == [CUSTOM_CALL]
    assert len(stack.upstream_requests) == 1  # the gateway ran nothing and asked nothing more
    assert not tool_call_spans(stack, None)  # the gateway ran nothing (the client's call is only checked)


async def test_chat_a_streamed_custom_call_reaches_the_client(make_stack: StackFactory) -> None:
    stack = await make_stack()
    head = {"index": 0, "id": "call_c1", "type": "custom", "custom": {"name": "grammar", "input": ""}}
    stack.script.then(Reply(raw_stream=sse(
        chunk({"role": "assistant", "content": None}),
        chunk({"tool_calls": [head]}),
        chunk({"tool_calls": [{"index": 0, "custom": {"input": "SELECT"}}]}),
        chunk({"tool_calls": [{"index": 0, "custom": {"input": " 1"}}]}),
        chunk({}, "tool_calls"))))
    status, events = await chat(stack, True, tools=[GRAMMAR])
    assert status == 200, events
    assert not [e for e in events if "error" in e], events
    parts = [p for e in events for c in e.get("choices", []) for p in c["delta"].get("tool_calls") or []]
    assert [p.get("type") for p in parts if p.get("id")] == ["custom"]
    assert parts[0]["id"] == "call_c1"
    assert parts[0]["custom"]["name"] == "grammar"
    assert "".join(p["custom"].get("input", "") for p in parts) == "SELECT 1"
    assert [c["finish_reason"] for e in events for c in e.get("choices", []) if c.get("finish_reason")] == [
        "tool_calls"]
    assert len(stack.upstream_requests) == 1
    assert not tool_call_spans(stack, None)  # not run as an unknown tool (the client's call is only checked)


@STREAM
async def test_chat_a_custom_call_beside_a_gateway_call(make_stack: StackFactory, stream: bool) -> None:
    """The gateway runs its own call and hands the client its custom one, in both stream modes."""
    stack = await make_stack()
    add = {"id": "call_a1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    if stream:
        stack.script.then(Reply(raw_stream=sse(
            chunk({"role": "assistant", "content": None}),
            chunk({"tool_calls": [{"index": 0, **add}]}),
            chunk({"tool_calls": [{"index": 1, **CUSTOM_CALL}]}),
            chunk({}, "tool_calls"))))
    else:
        stack.script.then(Reply(raw=completion({"role": "assistant", "content": None, "tool_calls": [add, CUSTOM_CALL]},
                                               "tool_calls")))
    status, events = await chat(stack, stream, tools=[GRAMMAR])
    assert status == 200, events
    if stream:
        parts = [p for e in events for c in e.get("choices", []) for p in c["delta"].get("tool_calls") or []]
        [call] = [p for p in parts if p.get("id")]
    else:
        [call] = events[0]["choices"][0]["message"]["tool_calls"]
    assert call["type"] == "custom"
    assert call["custom"]["name"] == "grammar"
    assert call["id"].endswith("call_c1")  # under an id naming the held turn
    trace = tool_call_spans(stack, None)
    assert [(s.attributes or {})[names.ATTR_TOOL_NAME] for s in trace] == ["add"]
    [custom] = tool_call_spans(stack, None, side=names.SIDE_CLIENT)
    assert (custom.attributes or {})[names.ATTR_OUTCOME] == "unchecked"  # not a function tool: nothing to check


# --- item 11: arguments sent as an object, in a stream -------------------------------------------------

async def test_streamed_object_arguments_reach_the_tool(make_stack: StackFactory) -> None:
    stack = await make_stack()
    head = {"index": 0, "id": "call_a1", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
    stack.script.then(Reply(raw_stream=sse(chunk({"role": "assistant", "content": None}), chunk({"tool_calls": [head]}),
                                           chunk({}, "tool_calls"))),
                      Reply(content="5"))
    answer = await stack.ask(True, messages=USER)
    assert answer.content == "5"
    assert [m["content"] for m in tool_messages(stack.upstream_requests[1])] == ["5"]
    assert tool_outcomes(stack, answer.headers["x-trace-id"]) == [("add", "ok")]


# --- item 6: a bounded pool of threads for sync tools ---------------------------------------------------

@STREAM
async def test_a_full_tool_pool_is_a_busy_outcome_not_a_stall(make_stack: StackFactory, stream: bool) -> None:
    release = threading.Event()
    started = threading.Semaphore(0)

    def stuck(args: dict[str, Any]) -> str:
        started.release()
        release.wait()
        return "late"

    registry = sample_registry()
    registry.register(Tool(name="stuck", function=stuck, timeout=0.05))
    stack = await make_stack(registry=registry, tool_threads=2)
    try:
        stack.script.then(Reply(tool_calls=[("stuck", {}), ("stuck", {}), ("read_file", {"path": "a"})]),
                          Reply(content="done"))
        answer = await asyncio.wait_for(stack.ask(stream, messages=USER), 10)
        assert answer.content == "done"
        results = [m["content"] for m in tool_messages(stack.upstream_requests[1])]
        assert [r.startswith("Tool 'stuck' did not finish") for r in results[:2]] == [True, True]
        assert results[2] == ("Tool 'read_file' is busy and did not run: all 2 threads for tools are held by "
                              "earlier calls that did not finish. Try again later.")
        trace = answer.headers["x-trace-id"]
        assert tool_outcomes(stack, trace) == [("stuck", "timeout"), ("stuck", "timeout"), ("read_file", "error")]
        [busy] = [s for s in stack.spans(trace) if s.name == names.SPAN_TOOL_CALL
                  and (s.attributes or {})[names.ATTR_TOOL_NAME] == "read_file"]
        assert (busy.attributes or {})[names.ATTR_ERROR_TYPE] == "tool_busy"
    finally:
        release.set()


CUSTOM_ITEM = {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_c1", "name": "grammar",
               "input": "SELECT 1", "status": "completed"}


def response(status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": "resp_rec", "object": "response", "created_at": 1, "model": "m", "status": status,
            "output": output, "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}}


@STREAM
async def test_responses_a_custom_call_reaches_the_client(make_stack: StackFactory, stream: bool) -> None:
    stack = await make_stack()
    if stream:
        added = {**CUSTOM_ITEM, "input": "", "status": "in_progress"}
        stack.script.then(Reply(raw_stream=sse(
            {"type": "response.created", "response": response("in_progress", [])},
            {"type": "response.output_item.added", "output_index": 0, "item": added},
            {"type": "response.custom_tool_call_input.delta", "output_index": 0, "item_id": "ctc_1",
             "delta": "SELECT 1"},
            {"type": "response.output_item.done", "output_index": 0, "item": CUSTOM_ITEM},
            {"type": "response.completed", "response": response("completed", [CUSTOM_ITEM])})))
    else:
        stack.script.then(Reply(raw=json.dumps(response("completed", [CUSTOM_ITEM])).encode()))
    body = {"model": "m", "input": "query", "stream": stream,
            "tools": [{"type": "custom", "name": "grammar", "description": "SQL in a grammar"}]}
    async with stack.http.post("/v1/responses", json=body, headers=AUTH) as answer:
        assert answer.status == 200
        text = await answer.text()
    if stream:
        events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
        assert not [e for e in events if e.get("type") == "error"], events
        final = events[-1]["response"]
    else:
        final = json.loads(text)
    assert [(i["type"], i["call_id"], i["input"]) for i in final["output"]] == [
        ("custom_tool_call", "call_c1", "SELECT 1")]
    assert len(stack.upstream_requests) == 1
    assert not tool_call_spans(stack, None)  # the gateway ran nothing (the client's call is only checked)
