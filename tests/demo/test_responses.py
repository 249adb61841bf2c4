"""The scripted model's Responses API, read by the official openai client and checked against its types."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer
from openai import AsyncOpenAI
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from gateway.demo.agent import DemoPolicy, FastPolicy
from gateway.demo.model import Reply, ScriptedModel

STREAM_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
WEATHER_TOOLS: list[Any] = [
    {"type": "function", "name": "get_weather", "description": "Weather in a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    {"type": "function", "name": "to_fahrenheit", "description": "Convert",
     "parameters": {"type": "object", "properties": {"celsius": {"type": "number"}}, "required": ["celsius"]}},
]


class Script:
    """Replies in order; `seen` keeps the (Chat-shaped) bodies the policy was given."""

    def __init__(self, *replies: Reply) -> None:
        self.replies = list(replies)
        self.seen: list[dict[str, Any]] = []

    def __call__(self, body: dict[str, Any]) -> Reply:
        self.seen.append(body)
        return self.replies.pop(0) if self.replies else Reply(status=500, error="no reply left")


class Recorder:
    """Wraps a policy, keeping what it saw."""

    def __init__(self, policy: Callable[[dict[str, Any]], Reply]) -> None:
        self.policy = policy
        self.seen: list[dict[str, Any]] = []

    def __call__(self, body: dict[str, Any]) -> Reply:
        self.seen.append(body)
        return self.policy(body)


Serve = Callable[..., Awaitable[tuple[ScriptedModel, AsyncOpenAI, TestServer]]]


@pytest.fixture
async def serve(aiohttp_server: Any) -> AsyncIterator[Serve]:
    clients: list[AsyncOpenAI] = []

    async def start(policy: Any, keep: int = 1000, **options: Any) -> tuple[ScriptedModel, AsyncOpenAI, TestServer]:
        model = ScriptedModel(policy, keep=keep)
        server = await aiohttp_server(model.app())
        client = AsyncOpenAI(base_url=str(server.make_url("/v1")), api_key="x", max_retries=0, **options)
        clients.append(client)
        return model, client, server

    yield start
    for client in clients:
        await client.close()


async def raw_post(server: TestServer, body: dict[str, Any]) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.post(server.make_url("/v1/responses"), json=body) as answer:
        return answer.status, await answer.read()


def parse_sse(text: bytes) -> list[dict[str, Any]]:
    """Every event, checked: an `event:` line naming its type, a valid typed event, numbered from 0."""
    events = []
    for block in text.decode().strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        assert set(lines) == {"event", "data"}
        data = json.loads(lines["data"])
        assert data["type"] == lines["event"]
        STREAM_EVENT.validate_python(data)  # every required field is there
        events.append(data)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


async def test_a_text_answer_is_a_full_response(serve: Serve) -> None:
    script = Script(Reply(content="Hello there, friend.", usage=(12, 7)))
    model, client, server = await serve(script)
    response = await client.responses.create(model="gpt-test", input="hi", instructions="Be brief.",
                                             metadata={"k": "v"}, temperature=0.5)
    assert response.output_text == "Hello there, friend."
    assert response.id.startswith("resp_scripted_")
    assert (response.object, response.status, response.model) == ("response", "completed", "gpt-test")
    [message] = response.output
    assert message.type == "message"
    assert (message.role, message.status, message.id[:4]) == ("assistant", "completed", "msg_")
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (12, 7, 19)
    assert response.usage.input_tokens_details.cached_tokens == 0
    assert response.usage.output_tokens_details.reasoning_tokens == 0
    assert (response.metadata, response.temperature, response.instructions) == ({"k": "v"}, 0.5, "Be brief.")
    assert (response.tools, response.tool_choice, response.parallel_tool_calls) == ([], "auto", True)
    assert model.requests[-1] == {"model": "gpt-test", "input": "hi", "instructions": "Be brief.",
                                  "metadata": {"k": "v"}, "temperature": 0.5}
    assert model.request_headers[-1]["Authorization"] == "Bearer x"
    [view] = script.seen
    assert view["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert (view["model"], view["stream"], view["temperature"]) == ("gpt-test", False, 0.5)

    script.replies.append(Reply(content="ok"))
    status, raw = await raw_post(server, {"model": "gpt-test", "input": "hi"})
    assert status == 200
    Response.model_validate(json.loads(raw))  # strict: every required field present


async def test_reasoning_and_tool_calls_come_out_in_order(serve: Serve) -> None:
    calls = [("get_weather", {"city": "Paris"}), ("add", '{"a": 1}')]
    script = Script(Reply(reasoning="The user wants weather.", content="Let me check.", tool_calls=calls),
                    Reply(tool_calls=calls[:1]))
    _, client, _ = await serve(script)
    first = await client.responses.create(model="m", input="weather?", tools=WEATHER_TOOLS,
                                          tool_choice={"type": "function", "name": "get_weather"})
    assert [item.type for item in first.output] == ["reasoning", "message", "function_call", "function_call"]
    reasoning, _message, weather, add = first.output
    assert reasoning.type == "reasoning"
    assert reasoning.id.startswith("rs_")
    assert [(s.type, s.text) for s in reasoning.summary] == [("summary_text", "The user wants weather.")]
    assert first.output_text == "Let me check."
    assert weather.type == "function_call"
    assert add.type == "function_call"
    assert (weather.name, json.loads(weather.arguments)) == ("get_weather", {"city": "Paris"})
    assert weather.status == "completed"
    assert (add.name, add.arguments) == ("add", '{"a": 1}')
    assert weather.id is not None
    assert weather.id.startswith("fc_")
    assert weather.call_id.startswith("call_")
    assert first.tool_choice.type == "function"  # echoed as sent
    assert [tool.type for tool in first.tools] == ["function", "function"]
    # call ids never repeat over the model's life
    second = await client.responses.create(model="m", input="again", tools=WEATHER_TOOLS)
    assert {c.call_id for c in second.output if c.type == "function_call"}.isdisjoint({weather.call_id, add.call_id})
    assert script.seen[0]["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert script.seen[0]["tools"][0] == {"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city", "parameters": WEATHER_TOOLS[0]["parameters"]}}


EXPECTED_STREAM = [
    "response.created", "response.in_progress",
    "response.output_item.added", "response.reasoning_summary_part.added",
    *["response.reasoning_summary_text.delta"] * 3,  # "Thinking hard." in pieces of 6 characters
    "response.reasoning_summary_text.done", "response.reasoning_summary_part.done", "response.output_item.done",
    "response.output_item.added", "response.content_part.added",
    *["response.output_text.delta"] * 4,  # "Checking the sky now."
    "response.output_text.done", "response.content_part.done", "response.output_item.done",
    "response.output_item.added", *["response.function_call_arguments.delta"] * 3,  # '{"city": "Paris"}'
    "response.function_call_arguments.done", "response.output_item.done",
    "response.completed",
]


async def test_a_stream_has_every_event_in_order(serve: Serve) -> None:
    reply = Reply(reasoning="Thinking hard.", content="Checking the sky now.",
                  tool_calls=[("get_weather", {"city": "Paris"})])
    _, client, server = await serve(Script(reply, reply))
    stream = await client.responses.create(model="m", input="weather?", tools=WEATHER_TOOLS, stream=True)
    events = [event async for event in stream]
    assert [e.type for e in events] == EXPECTED_STREAM
    assert [e.sequence_number for e in events] == list(range(len(events)))
    created, in_progress, *_, completed = events
    assert created.type == "response.created"
    assert in_progress.type == "response.in_progress"
    assert (created.response.status, created.response.output, created.response.usage) == ("in_progress", [], None)
    assert completed.type == "response.completed"
    final = completed.response
    assert final.status == "completed"
    assert final.usage is not None
    assert final.output_text == "Checking the sky now."
    _rs, msg, fc = final.output
    assert fc.type == "function_call"
    assert msg.type == "message"
    assert "".join(e.delta for e in events if e.type == "response.reasoning_summary_text.delta") == "Thinking hard."
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Checking the sky now."
    assert all(len(e.delta) <= 6 for e in events if e.type == "response.output_text.delta")
    assert "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta") == fc.arguments
    for event in events:  # every event points at the right item
        if hasattr(event, "output_index"):
            item = final.output[event.output_index]
            assert getattr(event, "item_id", item.id) == item.id
            assert getattr(event, "item", item).id == item.id
        if hasattr(event, "content_index") or hasattr(event, "summary_index"):
            assert getattr(event, "content_index", 0) == 0
            assert getattr(event, "summary_index", 0) == 0
    added = [e.item for e in events if e.type == "response.output_item.added"]
    assert [(i.type, i.status) for i in added] == [("reasoning", "in_progress"), ("message", "in_progress"),
                                                    ("function_call", "in_progress")]
    assert added[1].type == "message"
    assert added[1].content == []
    assert added[2].type == "function_call"
    assert added[2].arguments == ""
    assert added[2].call_id == fc.call_id

    status, raw = await raw_post(server, {"model": "m", "input": "weather?", "tools": WEATHER_TOOLS, "stream": True})
    assert status == 200
    assert b"[DONE]" not in raw
    assert [e["type"] for e in parse_sse(raw)] == EXPECTED_STREAM
    Response.model_validate(parse_sse(raw)[-1]["response"])


async def test_the_stream_helper_builds_the_final_response(serve: Serve) -> None:
    script = Script(Reply(content="Sunny, 21 °C.", reasoning="Easy."),
                    Reply(tool_calls=[("get_weather", {"city": "Lyon"}), ("to_fahrenheit", {"celsius": 21})]))
    _, client, _ = await serve(script)
    async with client.responses.stream(model="m", input="weather?") as stream:
        deltas = [event.delta async for event in stream if event.type == "response.output_text.delta"]
        final = await stream.get_final_response()
    assert "".join(deltas) == final.output_text == "Sunny, 21 °C."
    async with client.responses.stream(model="m", input="weather?", tools=WEATHER_TOOLS) as stream:
        final = await stream.get_final_response()
    calls = [(item.name, json.loads(item.arguments)) for item in final.output if item.type == "function_call"]
    assert calls == [("get_weather", {"city": "Lyon"}), ("to_fahrenheit", {"celsius": 21})]
    assert script.seen[0]["stream"] is True


async def test_the_policy_sees_a_chat_view_of_the_input(serve: Serve) -> None:
    script = Script(Reply(content="fine"))
    _, client, _ = await serve(script)
    items: list[Any] = [
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in "},
                                                         {"type": "input_image", "image_url": "http://x"},
                                                         {"type": "input_text", "text": "Paris?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "c2", "name": "clock", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "21 °C"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "noon"}]},
        {"type": "web_search_call", "id": "ws_1", "status": "completed"},
    ]
    await client.responses.create(model="m", input=items, instructions="sys", tool_choice="required",
                                  tools=[*WEATHER_TOOLS, {"type": "web_search"}], parallel_tool_calls=False)
    [view] = script.seen
    assert view["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "c2", "type": "function", "function": {"name": "clock", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "21 °C"},
        {"role": "tool", "tool_call_id": "c2", "content": "noon"},
    ]
    assert [t.get("function", {}).get("name") for t in view["tools"]] == ["get_weather", "to_fahrenheit", None]
    assert view["tools"][2] == {"type": "web_search"}
    assert (view["tool_choice"], view["parallel_tool_calls"]) == ("required", False)
    assert "input" not in view
    assert "instructions" not in view


async def test_previous_response_id_continues_the_conversation(serve: Serve) -> None:
    script = Script(Reply(content="Hi!"), Reply(tool_calls=[("get_weather", {"city": "Oslo"})]), Reply(content="Cold."))
    _, client, _ = await serve(script)
    first = await client.responses.create(model="m", input="hello", instructions="first rules")
    second = await client.responses.create(model="m", input="weather in Oslo?", previous_response_id=first.id,
                                           instructions="second rules", tools=WEATHER_TOOLS)
    assert second.previous_response_id == first.id
    [call] = second.output
    assert call.type == "function_call"
    await client.responses.create(model="m", previous_response_id=second.id, tools=WEATHER_TOOLS,
                                  input=[{"type": "function_call_output", "call_id": call.call_id, "output": "-3"}])
    assert script.seen[1]["messages"] == [  # instructions are not carried over
        {"role": "system", "content": "second rules"},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "Hi!"},
        {"role": "user", "content": "weather in Oslo?"},
    ]
    assert script.seen[2]["messages"] == [  # no instructions this time
        *script.seen[1]["messages"][1:],
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.call_id, "type": "function",
             "function": {"name": "get_weather", "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "-3"},
    ]


async def test_an_unknown_previous_response_is_refused(serve: Serve) -> None:
    script = Script(Reply(content="never"))
    model, client, _ = await serve(script)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model="m", input="hi", previous_response_id="resp_nope")
    assert refused.value.status_code == 400
    assert refused.value.body == {"message": "Previous response with id 'resp_nope' not found.",
                                  "type": "invalid_request_error", "param": "previous_response_id",
                                  "code": "previous_response_not_found"}
    assert script.seen == []
    assert len(model.requests) == 1


async def test_tool_calls_and_outputs_must_pair_up(serve: Serve) -> None:
    script = Script(Reply(tool_calls=[("get_weather", {"city": "Rome"})]))
    _, client, _ = await serve(script)
    first = await client.responses.create(model="m", input="weather?", tools=WEATHER_TOOLS)
    [call] = first.output
    assert call.type == "function_call"
    with pytest.raises(openai.BadRequestError) as missing:
        await client.responses.create(model="m", input="well?", previous_response_id=first.id)
    assert missing.value.body == {"message": f"No tool output found for function call {call.call_id}.",
                                  "type": "invalid_request_error", "param": "input", "code": None}
    with pytest.raises(openai.BadRequestError) as orphan:
        await client.responses.create(model="m", input=[
            {"role": "user", "content": "hi"}, {"type": "function_call_output", "call_id": "call_x", "output": "1"}])
    assert orphan.value.body == {"message": "No tool call found for function call output with call_id call_x.",
                                 "type": "invalid_request_error", "param": "input", "code": None}
    with pytest.raises(openai.BadRequestError, match="No tool call found for function call output with call_id c9"):
        await client.responses.create(model="m", input=[
            {"type": "function_call_output", "call_id": "c9", "output": "early"},  # an output must follow its call
            {"type": "function_call", "call_id": "c9", "name": "f", "arguments": "{}"}])
    assert len(script.seen) == 1


async def test_length_makes_an_incomplete_response(serve: Serve) -> None:
    _, client, _ = await serve(Script(Reply(content="This is cut", finish_reason="length"),
                                      Reply(content="This is cut", finish_reason="length")))
    response = await client.responses.create(model="m", input="long story")
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    stream = await client.responses.create(model="m", input="long story", stream=True)
    events = [event async for event in stream]
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.status == "incomplete"


async def test_store_false_and_keep_bound_what_can_be_continued(serve: Serve) -> None:
    model, client, _ = await serve(Script(*[Reply(content=str(i)) for i in range(5)]), keep=2)
    unstored = await client.responses.create(model="m", input="a", store=False)
    assert unstored.store is False
    with pytest.raises(openai.BadRequestError):
        await client.responses.create(model="m", input="b", previous_response_id=unstored.id)
    ids = [(await client.responses.create(model="m", input="c")).id for _ in range(3)]
    assert len(model.requests) == len(model.request_headers) == 2
    await client.responses.create(model="m", input="d", previous_response_id=ids[-1])
    with pytest.raises(openai.BadRequestError):  # the oldest of the three was dropped
        await client.responses.create(model="m", input="e", previous_response_id=ids[0])


async def test_the_reply_knobs_work_for_responses(serve: Serve) -> None:
    model, client, server = await serve(Script(
        Reply(status=503, error="provider down"),
        Reply(raw=b'{"not": "a response"', headers={"X-Scripted": "yes"}),
        Reply(raw=b'{"type": "oops"}'),
        Reply(content="a long enough answer", break_stream_after=3),
        Reply(content="a long enough answer", pause_after=2),
        Reply(hang=True),
    ), timeout=1.0)
    with pytest.raises(openai.InternalServerError, match="provider down"):
        await client.responses.create(model="m", input="hi")
    status, raw = await raw_post(server, {"model": "m", "input": "hi"})
    assert (status, raw) == (200, b'{"not": "a response"')
    status, raw = await raw_post(server, {"model": "m", "input": "hi", "stream": True})
    assert raw == b'data: {"type": "oops"}\n\n'

    received: list[bytes] = []

    async def read_all(answer: aiohttp.ClientResponse) -> None:
        async for chunk in answer.content.iter_any():
            received.append(chunk)

    async with aiohttp.ClientSession() as session, session.post(
            server.make_url("/v1/responses"), json={"model": "m", "input": "hi", "stream": True}) as answer:
        with pytest.raises(aiohttp.ClientPayloadError):  # the connection was cut
            await read_all(answer)
    assert [e["type"] for e in parse_sse(b"".join(received))] == ["response.created", "response.in_progress",
                                                        "response.output_item.added"]

    async with aiohttp.ClientSession() as session, session.post(
            server.make_url("/v1/responses"), json={"model": "m", "input": "hi", "stream": True}) as answer:
        await asyncio.wait_for(model.paused.wait(), 5)
    await asyncio.wait_for(model.dropped.wait(), 5)

    with pytest.raises(openai.APITimeoutError):
        await client.responses.create(model="m", input="hi")


async def test_demo_policy_renames_and_corrects_over_responses(serve: Serve) -> None:
    policy = Recorder(DemoPolicy())
    _, client, _ = await serve(policy)

    async def answer(previous: Any, output: str) -> Any:
        [call] = previous.output
        assert call.type == "function_call"
        return call, await client.responses.create(
            model="m", previous_response_id=previous.id, tools=WEATHER_TOOLS,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": output}])

    first = await client.responses.create(model="m", input="What is the weather in Lyon?", tools=WEATHER_TOOLS)
    wrong, second = await answer(first, "Invalid arguments: city_name (did you mean 'city'?)")
    assert (wrong.name, json.loads(wrong.arguments)) == ("get_weather", {"city_name": "Lyon"})
    weather = {"city": "Lyon", "temperature": 21, "unit": "celsius", "conditions": "sunshine"}
    fixed, third = await answer(second, json.dumps(weather))
    assert (fixed.name, json.loads(fixed.arguments)) == ("get_weather", {"city": "Lyon"})
    convert, last = await answer(third, "69.8")
    assert (convert.name, json.loads(convert.arguments)) == ("to_fahrenheit", {"celsius": 21})
    assert last.output_text == "In Lyon it is 21 °C (69.8 °F) with sunshine."
    assert [m["role"] for m in policy.seen[-1]["messages"]] == ["user", *["assistant", "tool"] * 3]


async def test_demo_policy_over_stateless_replayed_items(serve: Serve) -> None:
    _, client, _ = await serve(DemoPolicy())
    results = iter(["city_name (did you mean 'city'?)",
                    json.dumps({"city": "Nice", "temperature": 30, "unit": "celsius", "conditions": "no clouds"}),
                    "86"])
    items: list[Any] = [{"role": "user", "content": "Weather in Nice please"}]
    while True:
        response = await client.responses.create(model="m", input=items, tools=WEATHER_TOOLS, store=False)
        items += [item.to_dict() for item in response.output]
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            break
        items += [{"type": "function_call_output", "call_id": c.call_id, "output": next(results)} for c in calls]
    assert response.output_text == "In Nice it is 30 °C (86 °F) with no clouds."


async def test_fast_policy_over_responses(serve: Serve) -> None:
    _, client, _ = await serve(FastPolicy())
    echo = [{"type": "function", "name": "echo", "parameters": {"type": "object", "properties": {}}}]
    first = await client.responses.create(model="m", input="please use a tool", tools=echo)
    [call] = first.output
    assert call.type == "function_call"
    assert call.name == "echo"
    done = await client.responses.create(model="m", previous_response_id=first.id, tools=echo, input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "hi"}])
    assert done.output_text == "done"


async def test_chat_still_ignores_reasoning(serve: Serve) -> None:
    _, client, _ = await serve(Script(Reply(content="plain", reasoning="hidden")))
    completion = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert completion.choices[0].message.content == "plain"
