"""A client of one API on an upstream of another (issue 56), through the official clients: the
`anthropic` client on an OpenAI upstream (Messages translated to Chat Completions), the `openai`
client's Chat Completions on an Anthropic upstream, and its Responses on a Chat-only upstream and
on an Anthropic one, streamed and not, with a mixed turn (the gateway's tool and the client's own
in one answer), the client's result in the next request, the gateway's tool run once, and the
chat spans naming the pair."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import pytest
from pytest_aiohttp import AiohttpServer

from gateway.demo.model import Reply, ScriptedModel
from gateway.settings.model import Settings
from telemetry import names
from tests.conftest import STREAM, USER, Gateway, GatewayFactory, Script, StackFactory, sample_registry

pytestmark = pytest.mark.slow
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CHAT_WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                                 "parameters": WEATHER["input_schema"]}}
MIXED = Reply(content="Let me see.", tool_calls=[("add", {"a": 2, "b": 3}), ("get_weather", {"city": "Paris"})])


async def _messages(client: anthropic.AsyncAnthropic, stream: bool, **request: Any) -> dict[str, Any]:
    request = {"model": "claude-sonnet-4-5", "max_tokens": 512, **request}
    if not stream:
        return (await client.messages.create(**request)).model_dump(exclude_none=True)
    async with client.messages.stream(**request) as streamed:
        return (await streamed.get_final_message()).model_dump(exclude_none=True)


def _ran(spans: list[Any], tool: str) -> int:
    """How many times the gateway's `tool` ran to an outcome of ok."""
    return sum(1 for s in spans if s.name == names.SPAN_TOOL_CALL and s.attributes.get(names.ATTR_TOOL_NAME) == tool
               and s.attributes.get(names.ATTR_OUTCOME) == "ok")


def _text(content: Any) -> str:
    """A tool result's content as text: a string, or its text blocks joined."""
    return content if isinstance(content, str) else "".join(block["text"] for block in content)


def _pairs(spans: list[Any]) -> list[object]:
    return [s.attributes.get(names.ATTR_TRANSLATION) for s in spans if s.name.startswith("chat ")]


@STREAM
async def test_the_anthropic_client_on_an_openai_upstream(make_stack: StackFactory, stream: bool) -> None:
    stack = await make_stack(upstream_kind="openai")
    stack.script.then(MIXED)
    async with stack.anthropic() as client:
        first = await _messages(client, stream, messages=USER, tools=[WEATHER], system="Be brief.")
        [call] = [block for block in first["content"] if block["type"] == "tool_use"]
        assert (call["name"], call["input"], first["stop_reason"]) == ("get_weather", {"city": "Paris"}, "tool_use")
        assert [b["text"] for b in first["content"] if b["type"] == "text"] == ["Let me see."]
        stack.script.then(Reply(content="Sunny in Paris."))
        second = await _messages(client, stream, tools=[WEATHER], system="Be brief.", messages=[
            *USER, {"role": "assistant", "content": first["content"]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "sunny"}]}])
    assert [b["text"] for b in second["content"] if b["type"] == "text"] == ["Sunny in Paris."]
    assert second["stop_reason"] == "end_turn"
    assert all(path.startswith("/v1/chat/completions") for path in stack.model.request_paths)
    asked = stack.model.requests
    assert asked[0]["messages"][0] == {"role": "system", "content": "Be brief."}
    assert {t["function"]["name"] for t in asked[0]["tools"]} >= {"get_weather", "add"}
    # The gateway's add and the client's result, both as Chat tool messages, in the held turn's order.
    assert sorted(m["content"] for m in asked[-1]["messages"] if m["role"] == "tool") == ["5", "sunny"]
    assert _ran(stack.spans(), "add") == 1
    assert _pairs(stack.spans()) == ["messages->chat"] * 2
    assert stack.metric(names.METRIC_TRANSLATED_CALLS, pair="messages->chat") == 2


@STREAM
async def test_the_openai_client_on_an_anthropic_upstream(make_stack: StackFactory, stream: bool) -> None:
    stack = await make_stack(upstream_kind="anthropic")
    stack.script.then(MIXED)
    answer = await stack.ask(stream, messages=USER, tools=[CHAT_WEATHER])
    [call] = answer.tool_calls
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == ("get_weather", {"city": "Paris"})
    stack.script.then(Reply(content="Sunny in Paris."))
    final = await stack.ask(stream, tools=[CHAT_WEATHER], messages=[
        *USER, {"role": "assistant", "content": answer.content, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}])
    assert final.content == "Sunny in Paris."
    assert all(path.startswith("/v1/messages") for path in stack.model.request_paths)
    asked = stack.model.requests
    assert asked[0]["max_tokens"] > 0  # Anthropic requires it; the Chat client named none
    results = [block for message in asked[-1]["messages"] if isinstance(message["content"], list)
               for block in message["content"] if block.get("type") == "tool_result"]
    # the gateway's add and the client's get_weather, as Anthropic's tool results
    assert sorted(_text(r["content"]) for r in results) == ["5", "sunny"]
    assert _pairs(stack.spans()) == ["chat->messages"] * 2
    assert _ran(stack.spans(), "add") == 1


@STREAM
@pytest.mark.parametrize(("apis", "kind", "path", "pair"), [
    (("chat",), "vllm", "/v1/chat/completions", "responses->chat"),
    (("messages",), "anthropic", "/v1/messages", "responses->messages")], ids=["chat-only", "anthropic"])
async def test_the_openai_clients_responses_on_an_upstream_that_does_not_speak_them(
        aiohttp_server: AiohttpServer, make_gateway: GatewayFactory, tmp_path: Path, stream: bool,
        apis: tuple[str, ...], kind: str, path: str, pair: str) -> None:
    script = Script()
    model = ScriptedModel(script, apis=apis)
    model.base_url = str((await aiohttp_server(model.app())).make_url("")).rstrip("/")
    gateway = await make_gateway(Settings(port=0, trajectory_store_path=tmp_path / "s.sqlite3", upstreams={
        "only": {"url": f"{model.base_url}/v1", "kind": kind, "apis": list(apis), "models": ["*"]}}),
        registry=sample_registry())
    script.then(MIXED)
    tools: Any = [{"type": "function", "name": "get_weather", "description": "The weather in a city",
                   "parameters": WEATHER["input_schema"]}]
    first = await _respond(gateway, stream, input="What is 2 + 3, and the weather in Paris?", tools=tools)
    [call] = [item for item in first.output if item.type == "function_call"]
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    script.then(Reply(content="Sunny in Paris."))
    follow_up: Any = [{"role": "user", "content": "What is 2 + 3, and the weather in Paris?"},
                      *[item.model_dump(exclude_none=True) for item in first.output],
                      {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    second = await _respond(gateway, stream, input=follow_up, tools=tools)
    assert second.output_text == "Sunny in Paris."
    assert all(p.startswith(path) for p in model.request_paths)
    assert _pairs(gateway.spans()) == [pair] * 2
    assert _ran(gateway.spans(), "add") == 1


async def _respond(gateway: Gateway, stream: bool, **request: Any) -> Any:
    if not stream:
        return await gateway.client.responses.create(model="local-model", **request)
    async with gateway.client.responses.stream(model="local-model", **request) as streamed:
        return await streamed.get_final_response()
