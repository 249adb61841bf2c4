"""Chat completions through the gateway with the official openai client, streamed and not."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from gateway.demo.model import Reply
from gateway.tools import Tool, ToolRegistry
from telemetry import names
from tests.conftest import AUTH, STREAM, USER, Stack, StackFactory, call_args, tool_messages, tool_outcomes, tree

CLIENT_TOOL = {"type": "function", "function": {"name": "ask_human", "description": "Ask the user",
                                                 "parameters": {"type": "object", "properties": {
                                                     "question": {"type": "string"}}}}}


def chat_count(stack: Stack, trace_id: str) -> int:
    return len(tree(stack.spans(trace_id))["chat"])


@STREAM
async def test_plain_answer(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(content="Hi there, how can I help?"))
    answer = await stack.ask(stream, messages=USER)
    assert answer.content == "Hi there, how can I help?"
    assert answer.finish_reason == "stop"
    assert answer.tool_calls == []
    [sent] = stack.upstream_requests
    assert {t["function"]["name"] for t in sent["tools"]} == {"read_file", "add"}
    assert sent["messages"] == USER
    trace_id = answer.headers["x-trace-id"]
    assert answer.headers["x-trajectory-id"]
    assert chat_count(stack, trace_id) == 1
    assert tool_outcomes(stack, trace_id) == []
    if stream:
        assert answer.chunks > 3  # content arrived in pieces, as the upstream sent it


@STREAM
async def test_one_gateway_tool_round(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(tool_calls=[("read_file", {"path": "notes.txt"})]), Reply(content="It says hi."))
    answer = await stack.ask(stream, messages=USER)
    assert answer.content == "It says hi."
    assert answer.tool_calls == []
    _, second = stack.upstream_requests
    assert second["messages"][:1] == USER
    assistant = second["messages"][1]
    assert assistant["role"] == "assistant"
    assert [c["function"]["name"] for c in assistant["tool_calls"]] == ["read_file"]
    [result] = tool_messages(second)
    assert result == {"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"],
                      "content": "contents of notes.txt"}
    trace_id = answer.headers["x-trace-id"]
    assert chat_count(stack, trace_id) == 2
    assert tool_outcomes(stack, trace_id) == [("read_file", "ok")]
    if not stream:
        assert answer.headers["x-toolspan-rounds"] == "2"


@STREAM
async def test_parallel_gateway_calls_in_one_turn(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 2}), ("read_file", {"path": "x"}),
                                        ("add", {"a": 10, "b": 5})]),
                      Reply(content="3 and 15"))
    answer = await stack.ask(stream, messages=USER)
    assert answer.content == "3 and 15"
    results = tool_messages(stack.upstream_requests[1])
    assert [r["content"] for r in results] == ["3", "contents of x", "15"]
    call_ids = [c["id"] for c in stack.upstream_requests[1]["messages"][1]["tool_calls"]]
    assert [r["tool_call_id"] for r in results] == call_ids  # the model's order
    assert tool_outcomes(stack, answer.headers["x-trace-id"]) == [("add", "ok"), ("read_file", "ok"), ("add", "ok")]


@STREAM
async def test_renamed_argument_is_rejected_then_corrected(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(tool_calls=[("read_file", {"file_path": "a.txt"})]),
                      Reply(tool_calls=[("read_file", {"path": "a.txt"})]),
                      Reply(content="done"))
    answer = await stack.ask(stream, messages=USER)
    assert answer.content == "done"
    [diagnostic] = tool_messages(stack.upstream_requests[1])
    assert "Missing: path" in diagnostic["content"]
    assert "file_path (did you mean 'path'?)" in diagnostic["content"]
    assert "Accepted parameters: path, offset" in diagnostic["content"]
    assert tool_messages(stack.upstream_requests[2])[-1]["content"] == "contents of a.txt"
    trace_id = answer.headers["x-trace-id"]
    assert tool_outcomes(stack, trace_id) == [("read_file", "rejected"), ("read_file", "ok")]
    assert chat_count(stack, trace_id) == 3
    assert stack.metric(names.METRIC_TOOL_REJECTIONS, tool="read_file", reason="missing_arguments") == 1


@STREAM
async def test_unknown_tool_goes_back_to_the_model(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(tool_calls=[("read_fiel", {"path": "a"})]), Reply(content="sorry"))
    answer = await stack.ask(stream, messages=USER)
    assert answer.content == "sorry"
    assert answer.tool_calls == []  # never shown to the client
    [result] = tool_messages(stack.upstream_requests[1])
    assert "no tool named 'read_fiel'" in result["content"]
    assert "Did you mean 'read_file'?" in result["content"]
    assert tool_outcomes(stack, answer.headers["x-trace-id"]) == [("read_fiel", "rejected")]
    assert stack.metric(names.METRIC_TOOL_CALLS, tool=names.UNKNOWN_TOOL, outcome="rejected") == 1


@STREAM
async def test_client_tool_call_goes_to_the_client(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(tool_calls=[("ask_human", {"question": "which file?"})]))
    answer = await stack.ask(stream, messages=USER, tools=[CLIENT_TOOL])
    assert answer.finish_reason == "tool_calls"
    [call] = answer.tool_calls
    assert call["function"]["name"] == "ask_human"
    assert call_args(call) == {"question": "which file?"}
    [sent] = stack.upstream_requests
    assert [t["function"]["name"] for t in sent["tools"]] == ["ask_human", "read_file", "add"]
    assert tool_outcomes(stack, answer.headers["x-trace-id"]) == []


@STREAM
async def test_mixed_turn_and_its_follow_up(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(content="Let me check.", tool_calls=[("read_file", {"path": "a"}),
                                                                 ("ask_human", {"question": "ok?"})]),
                      Reply(content="All done."))
    first = await stack.ask(stream, messages=USER, tools=[CLIENT_TOOL])
    assert first.finish_reason == "tool_calls"
    [client_call] = first.tool_calls
    assert client_call["function"]["name"] == "ask_human"
    follow_up = [*USER,
                 {"role": "assistant", "content": first.content, "tool_calls": first.tool_calls},
                 {"role": "tool", "tool_call_id": client_call["id"], "content": "yes"}]
    second = await stack.ask(stream, messages=follow_up, tools=[CLIENT_TOOL])
    assert second.content == "All done."
    restored = stack.upstream_requests[1]["messages"]
    original = stack.upstream_requests[0]
    assert restored[0] == USER[0]
    assert [c["function"]["name"] for c in restored[1]["tool_calls"]] == ["read_file", "ask_human"]
    model_ids = [c["id"] for c in restored[1]["tool_calls"]]
    assert [(m["tool_call_id"], m["content"]) for m in restored[2:]] == [
        (model_ids[0], "contents of a"), (model_ids[1], "yes")]
    assert "tools" in original


@STREAM
async def test_round_limit_ends_with_a_tool_less_call(make_stack: StackFactory, stream: bool) -> None:
    stack = await make_stack(max_rounds=2)
    stack.script.then(*[Reply(tool_calls=[("add", {"a": 1, "b": 1})])] * 3)
    answer = await stack.ask(stream, messages=USER)
    assert len(stack.upstream_requests) == 3
    assert [r.get("tool_choice") for r in stack.upstream_requests] == [None, None, "none"]
    assert answer.tool_calls == []  # the third reply's gateway call never reaches the client
    assert answer.finish_reason == "stop"
    trace_id = answer.headers["x-trace-id"]
    root = tree(stack.spans(trace_id))["root"]
    assert root.attributes[names.ATTR_ROUND_LIMIT_REACHED] is True  # type: ignore[index]
    assert root.attributes[names.ATTR_ROUNDS] == 3  # type: ignore[index]
    if not stream:
        assert answer.headers["x-toolspan-round-limit"] == "reached"


@STREAM
async def test_usage_sums_every_round(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 2})], usage=(100, 7)),
                      Reply(tool_calls=[("add", {"a": 3, "b": 4})], usage=(150, 9)),
                      Reply(content="10", usage=(200, 11)))
    answer = await stack.ask(stream, messages=USER)
    assert answer.usage is not None
    assert (answer.usage["prompt_tokens"], answer.usage["completion_tokens"], answer.usage["total_tokens"]) == (
        450, 27, 477)
    assert stack.metric(names.METRIC_TOKENS, model="test-model", type="input") == 450
    assert stack.metric(names.METRIC_TOKENS, model="test-model", type="output") == 27


@STREAM
async def test_forced_gateway_tool_is_relaxed_after_it_ran(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 2})]), Reply(content="3"))
    forced = {"type": "function", "function": {"name": "add"}}
    answer = await stack.ask(stream, messages=USER, tool_choice=forced)
    assert answer.content == "3"
    assert [r.get("tool_choice") for r in stack.upstream_requests] == [forced, "auto"]


async def test_one_trace_with_the_request_as_root(stack: Stack) -> None:
    stack.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 2})]), Reply(content="3"))
    answer = await stack.ask(False, messages=USER)
    spans = stack.spans(answer.headers["x-trace-id"])
    found = tree(spans)
    assert found["root"].name == "POST /v1/chat/completions"
    assert [s.name for s in found["chat"]] == ["chat test-model", "chat test-model"]
    chat = found["chat"][0].attributes or {}
    assert chat[names.ATTR_REQUEST_MODEL] == "test-model"
    assert chat[names.ATTR_PROVIDER_NAME] == "toolspan.scripted"  # the built-in model answered
    assert chat[names.ATTR_FINISH_REASONS] == ("tool_calls",)
    assert chat[names.ATTR_INPUT_TOKENS] == 10
    assert str(chat[names.ATTR_RESPONSE_ID]).startswith("chatcmpl-scripted-")
    traceparent = stack.model.request_headers[0]["traceparent"]
    assert traceparent.split("-")[1] == answer.headers["x-trace-id"]
    assert traceparent.split("-")[2] == format(found["chat"][0].context.span_id, "016x")
    assert {s.name for s in spans} == {"POST /v1/chat/completions", "chat test-model", "tool.call", "tool.parse",
                                       "tool.execute"}


async def test_keepalive_comments_flow_while_tools_run(make_stack: StackFactory) -> None:
    release = asyncio.Event()

    async def slow(args: dict[str, Any]) -> str:
        await release.wait()  # set once the client has seen a keepalive: nothing else ends it
        return "finished"

    stack = await make_stack(registry=ToolRegistry([Tool(name="slow", function=slow)]), keepalive_seconds=0.05)
    stack.script.then(Reply(content="Checking. ", tool_calls=[("slow", {})]), Reply(content="All done."))
    lines: list[str] = []

    async def read() -> None:
        body = {"model": "m", "messages": USER, "stream": True}
        async with stack.http.post("/v1/chat/completions", json=body, headers=AUTH) as response:
            async for raw in response.content:
                line = raw.decode().strip()
                lines.append(line)
                if line == ": toolspan: running tools":
                    release.set()

    await asyncio.wait_for(read(), 10)
    assert ": toolspan: running tools" in lines
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: {")]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert content == "Checking. All done."  # both rounds on the same response
    assert [line for line in lines if line][-1] == "data: [DONE]"
