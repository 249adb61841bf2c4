"""The gateway as `toolspan serve` runs it with no provider configured: the built-in scripted model
plays its rename-and-correct story over both APIs, streamed and not, with the gateway's tools, and
with a tool of the client's own."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from openai import AsyncOpenAI
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.demo.tools import get_weather
from gateway.runtime.process import gateway
from gateway.settings.model import Settings
from gateway.tools import ToolRegistry
from telemetry import names
from tests.conftest import STREAM, spans_of

QUESTION = "What is the weather in Lisbon right now, in Fahrenheit?"
API = pytest.mark.parametrize("api", ["chat", "responses"])
TO_FAHRENHEIT = {"name": "to_fahrenheit", "description": "Celsius to Fahrenheit",
                 "parameters": {"type": "object", "properties": {"celsius": {"type": "number"}},
                                "required": ["celsius"]}}


class BuiltIn:
    """A gateway on the built-in model, and one question asked through the openai client."""

    def __init__(self, client: AsyncOpenAI, exporter: InMemorySpanExporter) -> None:
        self.client = client
        self.exporter = exporter

    async def ask(self, api: str, stream: bool, history: list[Any], tools: list[dict[str, Any]] | None = None,
                  ) -> tuple[str, list[dict[str, Any]], list[Any], str]:
        """(answer text, the client's calls, the output to replay, trace id)."""
        if api == "responses":
            extra: dict[str, Any] = {"tools": [{"type": "function", **t} for t in tools]} if tools else {}
            raw = await self.client.responses.with_raw_response.create(model="demo", input=history, stream=stream,
                                                                       store=False, **extra)
            response = [e async for e in raw.parse()][-1].response if stream else raw.parse()
            output = [item.model_dump(exclude_none=True) for item in response.output]
            calls = [item for item in output if item["type"] == "function_call"]
            return response.output_text, calls, output, raw.headers["x-trace-id"]
        extra = {"tools": [{"type": "function", "function": t} for t in tools]} if tools else {}
        raw_chat = await self.client.chat.completions.with_raw_response.create(
            model="demo", messages=history, stream=stream, **extra)
        text, calls = "", []
        if stream:
            parts: dict[int, dict[str, Any]] = {}
            async for chunk in raw_chat.parse():
                for choice in chunk.choices:
                    text += choice.delta.content or ""
                    for part in choice.delta.tool_calls or []:
                        call = parts.setdefault(part.index, {"id": part.id, "type": "function",
                                                             "function": {"name": "", "arguments": ""}})
                        call["function"]["name"] += (part.function.name or "") if part.function else ""
                        call["function"]["arguments"] += (part.function.arguments or "") if part.function else ""
            calls = [parts[i] for i in sorted(parts)]
        else:
            message = raw_chat.parse().choices[0].message
            text, calls = message.content or "", [c.model_dump() for c in message.tool_calls or []]
        reply = {"role": "assistant", "content": text or None, **({"tool_calls": calls} if calls else {})}
        return text, calls, [reply], raw_chat.headers["x-trace-id"]

    def outcomes(self, trace_id: str, side: str = names.SIDE_GATEWAY) -> list[tuple[str, str]]:
        """(tool, outcome) of the trace's tool calls of one side: the gateway's, or the client's it checked."""
        return [(str(s.attributes[names.ATTR_TOOL_NAME]), str(s.attributes[names.ATTR_OUTCOME]))  # type: ignore[index]
                for s in spans_of(self.exporter, trace_id) if s.name == names.SPAN_TOOL_CALL
                and (s.attributes or {}).get(names.ATTR_TOOL_SIDE) == side]


async def built_in(registry: ToolRegistry | None = None) -> AsyncIterator[BuiltIn]:
    exporter = InMemorySpanExporter()
    async with gateway(Settings(port=0), registry, processors=[SimpleSpanProcessor(exporter)]) as (url, _, model):
        assert model is not None  # no provider configured: the built-in one
        async with AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
            yield BuiltIn(client, exporter)


@pytest.fixture
async def demo() -> AsyncIterator[BuiltIn]:
    async for found in built_in():
        yield found


@pytest.fixture
async def demo_without_conversion() -> AsyncIterator[BuiltIn]:
    """The gateway offers only get_weather: the conversion is left to the client's own tool."""
    async for found in built_in(ToolRegistry([get_weather])):
        yield found


@API
@STREAM
async def test_the_rename_story_with_the_gateways_tools(demo: BuiltIn, api: str, stream: bool) -> None:
    text, calls, _, trace_id = await demo.ask(api, stream, [{"role": "user", "content": QUESTION}])
    assert text == "In Lisbon it is 9 °C (48.2 °F) with a light breeze."
    assert calls == []
    assert demo.outcomes(trace_id) == [("get_weather", "rejected"), ("get_weather", "ok"), ("to_fahrenheit", "ok")]


@API
@STREAM
async def test_the_story_ends_with_a_tool_of_the_clients_own(demo_without_conversion: BuiltIn, api: str,
                                                             stream: bool) -> None:
    demo = demo_without_conversion
    history: list[Any] = [{"role": "user", "content": QUESTION}]
    _, calls, output, trace_id = await demo.ask(api, stream, history, [TO_FAHRENHEIT])
    [call] = calls
    function = call.get("function", call)
    assert function["name"] == "to_fahrenheit"
    assert demo.outcomes(trace_id) == [("get_weather", "rejected"), ("get_weather", "ok")]
    assert demo.outcomes(trace_id, names.SIDE_CLIENT) == [("to_fahrenheit", "ok")]  # checked, handed to the client
    fahrenheit = round(json.loads(function["arguments"])["celsius"] * 9 / 5 + 32, 1)
    if api == "responses":
        history += [*output, {"type": "function_call_output", "call_id": call["call_id"], "output": str(fahrenheit)}]
    else:
        history += [*output, {"role": "tool", "tool_call_id": call["id"], "content": str(fahrenheit)}]
    text, calls, _, _ = await demo.ask(api, stream, history, [TO_FAHRENHEIT])
    assert text == "In Lisbon it is 9 °C (48.2 °F) with a light breeze."  # it saw the gateway's rounds again
    assert calls == []
