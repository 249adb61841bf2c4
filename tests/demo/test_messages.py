"""The scripted model's Messages API, read by Anthropic's own client, and the checks it makes as
Anthropic makes them (so that a gateway bug in a held turn or a thinking block shows as a 400)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import anthropic
import pytest
from aiohttp.test_utils import TestServer

from gateway.demo.agent import DemoPolicy
from gateway.demo.messages import signature
from gateway.demo.model import Reply, ScriptedModel

Serve = Callable[..., Awaitable[tuple[anthropic.AsyncAnthropic, TestServer]]]
USER = [{"role": "user", "content": "What is the weather in Lisbon?"}]
WEATHER = [{"name": "get_weather", "description": "Weather in a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]


@pytest.fixture
async def serve(aiohttp_server: Any) -> AsyncIterator[Serve]:
    clients: list[anthropic.AsyncAnthropic] = []

    async def start(policy: Any) -> tuple[anthropic.AsyncAnthropic, TestServer]:
        server = await aiohttp_server(ScriptedModel(policy).app())
        client = anthropic.AsyncAnthropic(base_url=str(server.make_url("")), api_key="x", max_retries=0)
        clients.append(client)
        return client, server

    yield start
    for client in clients:
        await client.close()


async def raw_post(server: TestServer, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(server.make_url(path), json=body) as answer:
        return answer.status, await answer.json()


@pytest.mark.parametrize("stream", [False, True])
async def test_the_demo_agent_answers_in_anthropics_shape_streamed_or_not(serve: Serve, stream: bool) -> None:
    client, _ = await serve(DemoPolicy())
    request: Any = {"model": "m", "max_tokens": 100, "messages": USER, "tools": WEATHER}
    if stream:
        async with client.messages.stream(**request) as streamed:
            message = await streamed.get_final_message()
    else:
        message = await client.messages.create(**request)
    [call] = [block for block in message.content if block.type == "tool_use"]
    assert (call.name, call.input) == ("get_weather", {"city_name": "Lisbon"})  # the demo's renamed argument
    assert message.stop_reason == "tool_use"
    assert message.usage.input_tokens == 10


async def test_a_thinking_block_is_signed_and_its_signature_checked(serve: Serve) -> None:
    client, server = await serve(lambda body: Reply(reasoning="Let me think.", content="Hi."))
    message = await client.messages.create(model="m", max_tokens=100, messages=USER)  # type: ignore[arg-type]
    [thinking, _] = message.content
    assert thinking.type == "thinking"
    assert thinking.signature == signature("Let me think.")
    altered = [*USER, {"role": "assistant", "content": [{"type": "thinking", "thinking": "Let me think!",
                                                         "signature": thinking.signature}]},
               {"role": "user", "content": "and?"}]
    status, body = await raw_post(server, "/v1/messages", {"model": "m", "max_tokens": 5, "messages": altered})
    assert (status, body["error"]["type"]) == (400, "invalid_request_error")
    assert "Invalid `signature` in `thinking` block" in body["error"]["message"]


@pytest.mark.parametrize(("messages", "said"), [
    ([*USER, {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]},
      {"role": "user", "content": "no result"}], "`tool_use` ids were found without `tool_result` blocks"),
    ([*USER, {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]},
      {"role": "user", "content": [{"type": "text", "text": "first"},
                                   {"type": "tool_result", "tool_use_id": "toolu_1"}]}],
     "`tool_use` ids were found without `tool_result` blocks"),  # a result must come first
    ([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9"}]}],
     "unexpected `tool_use_id` found in `tool_result` blocks: toolu_9"),
])
async def test_a_conversation_anthropic_refuses_is_refused(serve: Serve, messages: list[Any], said: str) -> None:
    _, server = await serve(lambda body: Reply(content="never"))
    status, body = await raw_post(server, "/v1/messages", {"model": "m", "max_tokens": 5, "messages": messages})
    assert status == 400
    assert body["type"] == "error"
    assert said in body["error"]["message"]


async def test_max_tokens_is_required_and_tokens_are_counted(serve: Serve) -> None:
    client, server = await serve(lambda body: Reply(content="never"))
    status, body = await raw_post(server, "/v1/messages", {"model": "m", "messages": USER})
    assert (status, body["error"]["message"]) == (400, "max_tokens: Field required")
    counted = await client.messages.count_tokens(model="m", messages=USER)  # type: ignore[arg-type]
    assert counted.input_tokens > 0


async def test_a_chat_tool_result_under_an_id_that_is_no_string_is_a_400(serve: Serve) -> None:
    """The demo agent once failed with a 500 on this (Schemathesis found it through the gateway)."""
    _, server = await serve(DemoPolicy())
    status, body = await raw_post(server, "/v1/chat/completions", {"model": "m", "messages": [
        {"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": [], "content": None}]})
    assert (status, body["error"]["param"]) == (400, "messages[1].tool_call_id")
