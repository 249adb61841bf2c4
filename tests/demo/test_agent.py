"""The built-in model calls a tool of the client's own (issue 35): through the gateway, the call is
handed back to the client, which runs it and sends the result; the model then answers quoting it.
Both APIs, streamed and not, through the real openai client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from openai import AsyncOpenAI

from gateway.demo.agent import DemoPolicy
from gateway.runtime.process import gateway
from gateway.settings.model import Settings
from tests.conftest import STREAM

API = pytest.mark.parametrize("api", ["chat", "responses"])
QUESTION = "Which orders are late?"
LOOKUP = {"name": "lookup_orders", "description": "The client's order database",
          "parameters": {"type": "object",
                         "properties": {"query": {"type": "string"}, "limit": {"type": "integer"},
                                        "status": {"type": "string", "enum": ["late", "shipped"]},
                                        "page": {"type": "integer", "default": 3}},
                         "required": ["query", "status", "page"]}}
SECOND = {"name": "never_first", "parameters": {"type": "object", "properties": {}}}


@pytest.fixture
async def client() -> AsyncIterator[AsyncOpenAI]:
    async with gateway(Settings(port=0)) as (url, _, model):
        assert model is not None  # the built-in model, with the example tools in the gateway
        async with AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as openai:
            yield openai


async def _chat(client: AsyncOpenAI, stream: bool, history: list[Any]) -> tuple[str, list[dict[str, Any]]]:
    tools: Any = [{"type": "function", "function": LOOKUP}, {"type": "function", "function": SECOND}]
    if not stream:
        message = (await client.chat.completions.create(model="m", messages=history, tools=tools)).choices[0].message
        return message.content or "", [c.model_dump() for c in message.tool_calls or []]
    text, calls = "", {}
    async for chunk in await client.chat.completions.create(model="m", messages=history, tools=tools, stream=True):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for part in choice.delta.tool_calls or []:
                call = calls.setdefault(part.index, {"id": part.id, "type": "function",
                                                     "function": {"name": "", "arguments": ""}})
                assert part.function is not None
                call["function"]["name"] += part.function.name or ""
                call["function"]["arguments"] += part.function.arguments or ""
    return text, [calls[i] for i in sorted(calls)]


async def _responses(client: AsyncOpenAI, stream: bool, history: list[Any]) -> tuple[str, list[dict[str, Any]]]:
    tools: Any = [{"type": "function", **LOOKUP}, {"type": "function", **SECOND}]
    if stream:
        events = [e async for e in await client.responses.create(model="m", input=history, tools=tools,
                                                                 store=False, stream=True)]
        response = events[-1].response  # type: ignore[union-attr]
    else:
        response = await client.responses.create(model="m", input=history, tools=tools, store=False)
    return response.output_text, [item.model_dump(exclude_none=True) for item in response.output]


@API
@STREAM
async def test_the_builtin_model_calls_the_clients_tool_and_quotes_its_result(client: AsyncOpenAI, api: str,
                                                                              stream: bool) -> None:
    ask = _responses if api == "responses" else _chat
    history: list[Any] = [{"role": "user", "content": QUESTION}]
    text, output = await ask(client, stream, history)
    calls = [item for item in output if api == "chat" or item["type"] == "function_call"]
    [call] = calls
    function = call["function"] if api == "chat" else call
    assert text == ""
    assert function["name"] == "lookup_orders"  # the first of the client's tools, not a gateway one
    # Required properties only: a string is the user's words, an enum its first value, else a default.
    assert json.loads(function["arguments"]) == {"query": QUESTION, "status": "late", "page": 3}
    result = "order 17 is two days late"
    if api == "chat":
        history += [{"role": "assistant", "content": None, "tool_calls": calls},
                    {"role": "tool", "tool_call_id": call["id"], "content": result}]
    else:
        history += [*output, {"type": "function_call_output", "call_id": call["call_id"], "output": result}]
    text, output = await ask(client, stream, history)
    assert text == f"(scripted model) Your tool lookup_orders answered: {result}"
    assert not [item for item in output if api == "chat" or item["type"] == "function_call"]


def test_without_gateway_tools_known_every_tool_counts_as_the_gateways() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": LOOKUP}]}
    assert DemoPolicy()(body).content == "(scripted model) You said: hi"
    assert DemoPolicy(gateway_tools={"lookup_orders"})(body).tool_calls[0][0] == "lookup_orders"  # the user's own
    beside_weather = {**body, "tools": [*body["tools"], {"type": "function", "function": {"name": "get_weather"}}]}
    policy = DemoPolicy(gateway_tools={"lookup_orders", "get_weather"})
    assert policy(beside_weather).tool_calls[0][0] == "lookup_orders"  # not a weather question: the user's own
    assert policy({**beside_weather, "messages": [{"role": "user", "content": "The weather in Oslo?"}]}
                  ).tool_calls[0] == ("get_weather", {"city_name": "Oslo"})  # a weather question: the story
    assert DemoPolicy(gateway_tools=set())(body).tool_calls[0][0] == "lookup_orders"
    assert DemoPolicy(gateway_tools=set())({**body, "tool_choice": "none"}).tool_calls == ()


@API
async def test_the_demo_shows_the_hand_back(client: AsyncOpenAI, api: str) -> None:
    from gateway.cli.demo import hand_back  # the demo's second part

    lines: list[str] = []
    answer = await hand_back(client, api, lines.append)
    assert answer == ("(scripted model) Your tool search_notes answered: Lisbon: the tram 28 leaves from "
                      "Martim Moniz; go before 9.")
    assert [line.split(":")[0] for line in lines] == [
        "\n--- a tool of the client's own (search_notes)", "user", "gateway -> client", "client runs it, sends back",
        "assistant"]


@STREAM
async def test_the_users_own_tool_served_beside_the_examples_is_called_for_any_other_question(stream: bool) -> None:
    """`toolspan serve --tools mytools:registry gateway.demo.tools:demo_registry` with no provider:
    a weather question gets the weather story, any other question runs the user's tool."""
    from gateway.demo.tools import demo_registry
    from gateway.tools import ToolRegistry, tool

    @tool
    def shout(text: str) -> str:
        """Say it louder.

        Args:
            text: what to say
        """
        return text.upper() + "!"

    async def ask(openai: AsyncOpenAI, question: str) -> str | None:
        history: Any = [{"role": "user", "content": question}]
        if stream:
            chunks = [c async for c in await openai.chat.completions.create(model="m", messages=history, stream=True)]
            return "".join(choice.delta.content or "" for c in chunks for choice in c.choices)
        return (await openai.chat.completions.create(model="m", messages=history)).choices[0].message.content

    registry = ToolRegistry([*demo_registry(), shout])
    async with (gateway(Settings(port=0), registry=registry) as (url, _, _model),
                AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as openai):
        assert await ask(openai, "hello") == "(scripted model) Your tool shout answered: HELLO!"
        assert (await ask(openai, "What is the weather in Lisbon?") or "").startswith("In Lisbon it is ")


async def test_the_example_tools_alone_answer_any_other_question_in_words(client: AsyncOpenAI) -> None:
    answer = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hello"}])
    assert answer.choices[0].message.content == "(scripted model) You said: hello"


@STREAM
async def test_the_builtin_model_runs_a_registry_of_the_users_own(stream: bool) -> None:
    """`toolspan serve --tools mytools:registry` with no provider: the first request runs the
    user's tool through the gateway, and the answer quotes its result."""
    from gateway.tools import ToolRegistry, tool

    @tool
    def shout(text: str) -> str:
        """Say it louder.

        Args:
            text: what to say
        """
        return text.upper() + "!"

    async with (gateway(Settings(port=0), registry=ToolRegistry([shout])) as (url, _, _model),
                AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as openai):
        history: list[Any] = [{"role": "user", "content": "hello"}]
        if stream:
            chunks = [c async for c in await openai.chat.completions.create(model="m", messages=history, stream=True)]
            text = "".join(choice.delta.content or "" for c in chunks for choice in c.choices)
        else:
            text = (await openai.chat.completions.create(model="m", messages=history)).choices[0].message.content
    assert text == "(scripted model) Your tool shout answered: HELLO!"
