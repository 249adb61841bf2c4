"""`toolspan demo`: a scripted agent session through the real openai client (or, over the Messages
API, Anthropic's), then its trajectory."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from typing import Any

from anthropic import AsyncAnthropic
from openai import AsyncOpenAI
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.demo.mcp_server import with_mcp_examples
from gateway.runtime.process import gateway
from gateway.settings.load import load_settings
from gateway.tools import ToolRegistry
from telemetry.store.records import write
from telemetry.store.report import trajectory
from telemetry.store.report_text import timeline
from telemetry.store.schema import SCHEMA
from telemetry.store.span_records import record_of

QUESTION = "What is the weather in Lisbon right now, in Fahrenheit?"


def print_trajectory(spans: list[ReadableSpan], trajectory_id: str, out: Callable[[str], None]) -> None:
    """The trajectory as `toolspan trajectories show` prints it: the spans go through the store's
    schema (a database in memory) and its timeline, so both print exactly the same."""
    db = sqlite3.connect(":memory:")
    db.executescript(SCHEMA)
    write(db, sorted((record_of(s) for s in spans), key=lambda r: r.end_ns))
    found = trajectory(db, trajectory_id)
    for line in timeline(found, events_only=True) if found is not None else ():
        out(line)


Client = AsyncOpenAI | AsyncAnthropic


async def _ask_messages(client: AsyncAnthropic) -> tuple[str, dict[str, Any], dict[str, str]]:
    raw = await client.messages.with_raw_response.create(
        model="toolspan-demo", max_tokens=1024, messages=[{"role": "user", "content": QUESTION}])
    message = await raw.parse()
    text = "".join(block.text for block in message.content if block.type == "text")
    return text, message.usage.model_dump(exclude_none=True), dict(raw.headers)


async def _ask(client: Client, api: str) -> tuple[str, dict[str, Any], dict[str, str]]:
    """The question through the API's client: the answer, the usage, the response headers."""
    if isinstance(client, AsyncAnthropic):
        return await _ask_messages(client)
    if api == "responses":
        raw_response = await client.responses.with_raw_response.create(model="toolspan-demo", input=QUESTION)
        response = raw_response.parse()
        usage = response.usage.model_dump() if response.usage else {}
        return response.output_text, usage, dict(raw_response.headers)
    raw = await client.chat.completions.with_raw_response.create(
        model="toolspan-demo", messages=[{"role": "user", "content": QUESTION}])
    completion = raw.parse()
    usage = completion.usage.model_dump() if completion.usage else {}
    return completion.choices[0].message.content or "", usage, dict(raw.headers)


NOTES_QUESTION = "What did I note about Lisbon?"
SEARCH_NOTES = {"name": "search_notes", "description": "Search the user's own notes (a tool the client runs)",
                "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}
NOTE = "Lisbon: the tram 28 leaves from Martim Moniz; go before 9."


def search_notes(arguments: dict[str, Any]) -> str:
    """The client's own tool: the gateway never runs it, it hands the model's call back."""
    return NOTE if "lisbon" in str(arguments.get("query", "")).lower() else "no note found"


async def _hand_back_chat(client: AsyncOpenAI, out: Callable[[str], None]) -> str:
    history: list[Any] = [{"role": "user", "content": NOTES_QUESTION}]
    tools: Any = [{"type": "function", "function": SEARCH_NOTES}]
    first = await client.chat.completions.create(model="toolspan-demo", messages=history, tools=tools)
    message = first.choices[0].message
    results = []
    for call in message.tool_calls or []:
        arguments = json.loads(call.function.arguments)  # type: ignore[union-attr]
        out(f"gateway -> client: call {call.function.name}({call.function.arguments})"  # type: ignore[union-attr]
            f"   (finish_reason: {first.choices[0].finish_reason})")
        results.append({"role": "tool", "tool_call_id": call.id, "content": search_notes(arguments)})
        out(f"client runs it, sends back: {results[-1]['content']}")
    history += [message.model_dump(exclude_none=True), *results]
    final = await client.chat.completions.create(model="toolspan-demo", messages=history, tools=tools)
    return final.choices[0].message.content or ""


async def _hand_back_responses(client: AsyncOpenAI, out: Callable[[str], None]) -> str:
    tools: Any = [{"type": "function", **SEARCH_NOTES}]
    first = await client.responses.create(model="toolspan-demo", input=NOTES_QUESTION, tools=tools, store=False)
    history: list[Any] = [{"role": "user", "content": NOTES_QUESTION}]
    for item in first.output:
        history.append(item.model_dump(exclude_none=True))
        if item.type == "function_call":
            out(f"gateway -> client: call {item.name}({item.arguments})   (a function_call item)")
            history.append({"type": "function_call_output", "call_id": item.call_id,
                            "output": search_notes(json.loads(item.arguments))})
            out(f"client runs it, sends back: {history[-1]['output']}")
    final = await client.responses.create(model="toolspan-demo", input=history, tools=tools, store=False)
    return final.output_text


async def _hand_back_messages(client: AsyncAnthropic, out: Callable[[str], None]) -> str:
    tools: Any = [{"name": SEARCH_NOTES["name"], "description": SEARCH_NOTES["description"],
                   "input_schema": SEARCH_NOTES["parameters"]}]
    history: list[Any] = [{"role": "user", "content": NOTES_QUESTION}]
    first = await client.messages.create(model="toolspan-demo", max_tokens=1024, messages=history, tools=tools)
    results = []
    for block in first.content:
        if block.type == "tool_use":
            out(f"gateway -> client: call {block.name}({json.dumps(block.input)})   (stop_reason: {first.stop_reason})")
            results.append({"type": "tool_result", "tool_use_id": block.id,
                            "content": search_notes(dict(block.input))})
            out(f"client runs it, sends back: {results[-1]['content']}")
    history += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                {"role": "user", "content": results}]
    final = await client.messages.create(model="toolspan-demo", max_tokens=1024, messages=history, tools=tools)
    return "".join(block.text for block in final.content if block.type == "text")


async def hand_back(client: Client, api: str, out: Callable[[str], None]) -> str:
    """The second part of the demo: the client offers a tool of its own; the built-in model calls
    it, the gateway hands the call back, the client runs it and sends the result, the model answers."""
    out(f"\n--- a tool of the client's own ({SEARCH_NOTES['name']}): the gateway hands its call back")
    out(f"user: {NOTES_QUESTION}")
    if isinstance(client, AsyncAnthropic):
        answer = await _hand_back_messages(client, out)
    else:
        answer = await (_hand_back_responses(client, out) if api == "responses" else _hand_back_chat(client, out))
    out(f"assistant: {answer}")
    return answer


async def run_demo(out: Callable[[str], None] = print, api: str = "chat", mcp: bool = False) -> str:
    """Runs the session over the Chat Completions, Responses or Messages API; returns the final answer.
    With `mcp`, the example tools come from `toolspan mcp-examples`, an MCP server over stdio."""
    exporter = InMemorySpanExporter()
    # Content capture on: the demo's store keeps the messages, for `toolspan trajectories show` and
    # `export`; and every call's arguments, so that `toolspan trajectories replay` can replay them all.
    settings = load_settings({"port": 0, "capture_message_content": True,  # a bad variable: one line
                              "record_tool_arguments": True})
    settings = with_mcp_examples(settings) if mcp else settings
    registry = ToolRegistry() if mcp else None  # None: the example tools, registered in this process
    async with gateway(settings, registry, processors=[SimpleSpanProcessor(exporter)]) as (url, _, _model):
        client: Client = (AsyncAnthropic(base_url=url, api_key="demo-key-not-needed") if api == "messages"
                          else AsyncOpenAI(base_url=f"{url}/v1", api_key="demo-key-not-needed"))
        shown = {"responses": "Responses API", "messages": "Messages API"}.get(api, "Chat Completions API")
        tools = "an MCP server over stdio (toolspan mcp-examples)" if mcp else "registered in the gateway"
        base = url if api == "messages" else f"{url}/v1"  # as each client library takes its base URL
        out(f"toolspan demo: gateway at {base} ({shown}), upstream: the built-in scripted model")
        out(f"tools: {tools}")
        out(f"user: {QUESTION}\n")
        answer, usage, headers = await _ask(client, api)
        trace_id = headers.get("x-trace-id", "")
        print_trajectory(list(exporter.get_finished_spans()), headers.get("x-trajectory-id", ""), out)
        out(f"\nassistant: {answer}")
        out(f"usage (all rounds): {json.dumps(usage, separators=(',', ':'))}")
        out(f"rounds: {headers.get('x-toolspan-rounds')}  trajectory: {headers.get('x-trajectory-id')}"
            f"  trace id: {trace_id}")
        await hand_back(client, api, out)
        await client.close()
        return answer
