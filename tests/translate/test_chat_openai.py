"""The Chat side against the official openai client, on both ends of a small aiohttp server: what
openai-python sends is read by CHAT.read_request, and what CHAT.write_answer and the stream writer
give back is what openai-python parses, its own stream accumulator included."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from aiohttp import web
from openai import AsyncOpenAI
from pytest_aiohttp import AiohttpServer

from gateway.translate.chat import CHAT
from gateway.translate.chat_stream import ChatStreamWriting
from gateway.translate.neutral import (
    Answer,
    ArgumentsDelta,
    Finished,
    PartEnded,
    PartStarted,
    Request,
    Started,
    StreamEvent,
    Text,
    TextDelta,
    Thinking,
    ThinkingDelta,
    ToolCall,
    ToolDecl,
    ToolResult,
    Turn,
    Usage,
)

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
ANSWER = Answer("msg_01", "claude-x", (Thinking("Two cities."), Text("Checking both."),
                                       ToolCall("toolu_a", "weather", '{"city":"Oslo"}'),
                                       ToolCall("toolu_b", "weather", '{"city":"Lima"}')),
                "tool_calls", Usage(120, 30, cache_read_tokens=100))
EVENTS: list[StreamEvent] = [
    Started("msg_01", "claude-x"), PartStarted(0, Thinking("")), ThinkingDelta(0, "Two cities."), PartEnded(0),
    PartStarted(1, Text("")), TextDelta(1, "Checking "), TextDelta(1, "both."), PartEnded(1),
    PartStarted(2, ToolCall("toolu_a", "weather", "")), ArgumentsDelta(2, '{"city"'),
    PartStarted(3, ToolCall("toolu_b", "weather", "")), ArgumentsDelta(3, '{"city":"Lima"}'),
    ArgumentsDelta(2, ':"Oslo"}'), PartEnded(2), PartEnded(3), Finished("tool_calls", ANSWER.usage)]


async def _client(aiohttp_server: AiohttpServer, received: list[Request]) -> AsyncOpenAI:
    async def completions(request: web.Request) -> web.StreamResponse:
        read = CHAT.read_request(await request.json())
        received.append(read)
        if not read.stream:
            return web.json_response(CHAT.write_answer(ANSWER))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        writing = ChatStreamWriting(read.stream_usage)
        for event in EVENTS:
            for chunk in writing.write(event):
                await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    server = await aiohttp_server(app)
    return AsyncOpenAI(base_url=str(server.make_url("/v1")), api_key="test", max_retries=0, timeout=20)


MESSAGES: list[Any] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Oslo and Lima?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Lima"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "-3 C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "19 C"},
    {"role": "user", "content": "And tomorrow?"}]
TOOLS: list[Any] = [{"type": "function", "function": {"name": "weather", "description": "Weather now",
                                                      "parameters": WEATHER}}]
ASKED = Request(
    model="claude-x", system=("Be brief.",),
    turns=(Turn("user", (Text("Weather in Oslo and Lima?"),)),
           Turn("assistant", (ToolCall("call_1", "weather", '{"city":"Oslo"}'),
                              ToolCall("call_2", "weather", '{"city":"Lima"}'))),
           Turn("user", (ToolResult("call_1", (Text("-3 C"),)), ToolResult("call_2", (Text("19 C"),)),
                         Text("And tomorrow?")))),
    tools=(ToolDecl("weather", "Weather now", WEATHER),), tool_choice="required", parallel_tool_calls=True,
    max_tokens=500, stop=("END",), user="u-7")


async def test_the_openai_clients_request_is_read_and_the_answer_parsed(aiohttp_server: AiohttpServer) -> None:
    received: list[Request] = []
    client = await _client(aiohttp_server, received)
    completion = await client.chat.completions.create(
        model="claude-x", messages=MESSAGES, tools=TOOLS, tool_choice="required", parallel_tool_calls=True,
        max_completion_tokens=500, stop="END", user="u-7", seed=1)
    assert received == [replace(ASKED, dropped=("seed",))]
    message = completion.choices[0].message
    assert (completion.id, completion.model) == ("msg_01", "claude-x")
    assert completion.choices[0].finish_reason == "tool_calls"
    assert message.content == "Checking both."
    assert getattr(message, "reasoning_content", None) == "Two cities."  # vLLM's field, kept as an extra
    calls = [c for c in message.tool_calls or [] if c.type == "function"]
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        ("toolu_a", "weather", '{"city":"Oslo"}'), ("toolu_b", "weather", '{"city":"Lima"}')]
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens, completion.usage.total_tokens) == (
        120, 30, 150)
    assert completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens == 100


async def test_a_stream_is_assembled_by_the_openai_clients_own_accumulator(aiohttp_server: AiohttpServer) -> None:
    received: list[Request] = []
    client = await _client(aiohttp_server, received)
    async with client.chat.completions.stream(
            model="claude-x", messages=MESSAGES, tools=TOOLS, tool_choice="required", parallel_tool_calls=True,
            max_completion_tokens=500, stop=["END"], user="u-7", stream_options={"include_usage": True}) as stream:
        completion = await stream.get_final_completion()
    assert received == [replace(ASKED, stream=True, stream_usage=True)]
    message = completion.choices[0].message
    assert (completion.id, completion.choices[0].finish_reason, message.content) == (
        "msg_01", "tool_calls", "Checking both.")
    assert [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []] == [
        ("toolu_a", "weather", '{"city":"Oslo"}'), ("toolu_b", "weather", '{"city":"Lima"}')]
    assert completion.usage is not None
    assert completion.usage.total_tokens == 150


async def test_a_stream_without_the_usage_asked_for_has_no_usage_chunk(aiohttp_server: AiohttpServer) -> None:
    received: list[Request] = []
    client = await _client(aiohttp_server, received)
    chunks = [chunk async for chunk in await client.chat.completions.create(
        model="claude-x", messages=MESSAGES, stream=True)]
    assert received[0].stream_usage is False
    assert all(chunk.choices for chunk in chunks)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
