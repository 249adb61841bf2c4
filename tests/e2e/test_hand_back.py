"""Handing the client its calls after the gateway ran its own tools in the same request: the
gateway's rounds are held, and the client's follow-up gets them back, in both APIs."""

from __future__ import annotations

import json
from typing import Any

from gateway.demo.model import Reply
from tests.conftest import STREAM, Stack

ASK = {"name": "ask_human", "description": "Ask the user", "parameters": {"type": "object", "properties": {}}}


def saw_the_sum(body: dict[str, Any]) -> Reply:
    """The model's last turn: it answers only if the gateway's earlier round is in its view."""
    results = [m["content"] for m in body["messages"] if m.get("role") == "tool"]
    assert results == ["5", "Paris"], results
    return Reply(content="5, in Paris.")


@STREAM
async def test_chat_follow_up_gets_the_gateway_round_back(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(content="Adding. ", tool_calls=[("add", {"a": 2, "b": 3})]),
                      Reply(tool_calls=[("ask_human", {})]), saw_the_sum)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "add, then ask me where"}]
    first = await stack.ask(stream, messages=messages, tools=[{"type": "function", "function": ASK}])
    [call] = first.tool_calls
    assert call["id"].startswith("tspan_")  # it names the held rounds
    assert first.content == "Adding. "
    messages += [{"role": "assistant", "content": first.content, "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": call["id"], "content": "Paris"}]
    second = await stack.ask(stream, messages=messages, tools=[{"type": "function", "function": ASK}])
    assert second.content == "5, in Paris."
    sent = stack.upstream_requests[-1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "assistant", "tool"]
    assert sent[1]["content"] == "Adding. "
    assert sent[3]["tool_calls"][0]["id"] == call["id"].split("_", 2)[2]  # the provider's own id again


@STREAM
async def test_responses_follow_up_gets_the_gateway_round_back(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(content="Adding.", tool_calls=[("add", {"a": 2, "b": 3})]),
                      Reply(tool_calls=[("ask_human", {})]), saw_the_sum)
    tools = [{"type": "function", **ASK}]
    first = await stack.respond(stream, input="add, then ask me where", tools=tools, store=False)
    [call] = first.calls
    assert call["call_id"].startswith("tspan_")
    assert first.text == "Adding."
    follow_up = [{"role": "user", "content": "add, then ask me where"}, *first.output,
                 {"type": "function_call_output", "call_id": call["call_id"], "output": "Paris"}]
    second = await stack.respond(stream, input=follow_up, tools=tools, store=False)
    assert second.text == "5, in Paris."
    sent = stack.upstream_requests[-1]["input"]
    assert [(i.get("type"), i.get("name")) for i in sent] == [
        (None, None), ("message", None), ("function_call", "add"), ("function_call_output", None),
        ("function_call", "ask_human"), ("function_call_output", None)]
    assert json.loads(sent[2]["arguments"]) == {"a": 2, "b": 3}


async def test_without_a_gateway_round_the_client_call_is_the_providers_own(stack: Stack) -> None:
    stack.script.then(Reply(tool_calls=[("ask_human", {})]))
    answer = await stack.ask(False, messages=[{"role": "user", "content": "ask"}],
                             tools=[{"type": "function", "function": ASK}])
    [call] = answer.tool_calls
    assert not call["id"].startswith("tspan_")
