"""`toolspan demo`: a scripted agent session through the real openai client, then its trajectory."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from openai import AsyncOpenAI
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.demo.mcp_server import with_mcp_examples
from gateway.runtime import gateway
from gateway.settings import Settings
from gateway.tools import ToolRegistry
from telemetry import names

QUESTION = "What is the weather in Lisbon right now, in Fahrenheit?"


def _ms(span: ReadableSpan) -> float:
    return ((span.end_time or 0) - (span.start_time or 0)) / 1e6


def _is_chat(span: ReadableSpan) -> bool:
    return span.name.startswith(names.SPAN_CHAT_PREFIX + " ")


def _describe(span: ReadableSpan) -> str:
    attrs: dict[str, Any] = dict(span.attributes or {})
    if _is_chat(span):
        reasons = ",".join(attrs.get(names.ATTR_FINISH_REASONS, ()))
        return (f"model turn  {span.name}: finish={reasons} tokens in/out="
                f"{attrs.get(names.ATTR_INPUT_TOKENS)}/{attrs.get(names.ATTR_OUTPUT_TOKENS)} ({_ms(span):.1f} ms)")
    reason = attrs.get(names.ATTR_REJECTION_REASON)
    server = attrs.get(names.ATTR_MCP_SERVER)
    line = (f"  tool call {attrs.get(names.ATTR_TOOL_NAME)}: {attrs.get(names.ATTR_OUTCOME)}"
            f"{f' ({reason})' if reason else ''} ({_ms(span):.2f} ms)"
            f"{f' [MCP server {server!r}, {attrs.get(names.ATTR_MCP_METHOD_NAME)}]' if server else ''}")
    if span.status.description:
        line += "\n" + "\n".join(f"      | {text}" for text in span.status.description.splitlines())
    return line


def print_trajectory(spans: list[ReadableSpan], trace_id: str, out: Callable[[str], None]) -> None:
    mine = [s for s in spans if format(s.context.trace_id, "032x") == trace_id]
    for span in sorted(mine, key=lambda s: s.start_time or 0):
        if _is_chat(span) or span.name == names.SPAN_TOOL_CALL:
            out(_describe(span))


async def _ask(client: AsyncOpenAI, api: str) -> tuple[str, dict[str, Any], dict[str, str]]:
    """The question through the openai client: the answer, the usage, the response headers."""
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


async def run_demo(out: Callable[[str], None] = print, api: str = "chat", mcp: bool = False) -> str:
    """Runs the session over the Chat Completions API or the Responses API; returns the final answer.
    With `mcp`, the example tools come from `toolspan mcp-examples`, an MCP server over stdio."""
    exporter = InMemorySpanExporter()
    settings = with_mcp_examples(Settings(port=0)) if mcp else Settings(port=0)
    registry = ToolRegistry() if mcp else None  # None: the example tools, registered in this process
    async with gateway(settings, registry, processors=[SimpleSpanProcessor(exporter)]) as (url, _, _model):
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key="demo-key-not-needed")
        shown = "Responses API" if api == "responses" else "Chat Completions API"
        tools = "an MCP server over stdio (toolspan mcp-examples)" if mcp else "registered in the gateway"
        out(f"toolspan demo: gateway at {url}/v1 ({shown}), upstream: the built-in scripted model")
        out(f"tools: {tools}")
        out(f"user: {QUESTION}\n")
        answer, usage, headers = await _ask(client, api)
        trace_id = headers.get("x-trace-id", "")
        print_trajectory(list(exporter.get_finished_spans()), trace_id, out)
        out(f"\nassistant: {answer}")
        out(f"usage (all rounds): {json.dumps(usage, separators=(',', ':'))}")
        out(f"rounds: {headers.get('x-toolspan-rounds')}  trajectory: {headers.get('x-trajectory-id')}"
            f"  trace id: {trace_id}")
        await client.close()
        return answer
