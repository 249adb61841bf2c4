"""`toolspan demo`: a scripted agent session through the real openai client, then its trajectory."""

from __future__ import annotations

import json
import sqlite3
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
from telemetry.records import SCHEMA, record_of, write
from telemetry.report import trajectory
from telemetry.report_text import timeline

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
    # Content capture on: the demo's store keeps the messages, for `toolspan trajectories show`.
    settings = Settings(port=0, capture_message_content=True)
    settings = with_mcp_examples(settings) if mcp else settings
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
        print_trajectory(list(exporter.get_finished_spans()), headers.get("x-trajectory-id", ""), out)
        out(f"\nassistant: {answer}")
        out(f"usage (all rounds): {json.dumps(usage, separators=(',', ':'))}")
        out(f"rounds: {headers.get('x-toolspan-rounds')}  trajectory: {headers.get('x-trajectory-id')}"
            f"  trace id: {trace_id}")
        await client.close()
        return answer
