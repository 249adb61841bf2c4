"""Shared test helpers: the whole gateway served by pytest-aiohttp's `aiohttp_server`, an
in-process scripted upstream, the real openai client, and an aiohttp test client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from openai import AsyncOpenAI
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpClient, AiohttpServer

from gateway.app import create_app
from gateway.demo.model import Reply, ScriptedModel
from gateway.runtime import Observability, build_telemetry
from gateway.settings import Settings
from gateway.tools import Param, Tool, ToolRegistry
from telemetry import names


class Script:
    """Replies in order, one per upstream request; a callable entry sees the request body."""

    def __init__(self) -> None:
        self.replies: list[Reply | Callable[[dict[str, Any]], Reply]] = []

    def then(self, *replies: Reply | Callable[[dict[str, Any]], Reply]) -> Script:
        self.replies.extend(replies)
        return self

    def __call__(self, body: dict[str, Any]) -> Reply:
        if not self.replies:
            return Reply(status=500, error="the test script has no reply left")
        reply = self.replies.pop(0)
        return reply(body) if callable(reply) else reply


def read_file(args: dict[str, Any]) -> str:
    return f"contents of {args['path']}"


async def add(args: dict[str, Any]) -> str:
    return str(args["a"] + args["b"])


def sample_registry() -> ToolRegistry:
    return ToolRegistry([
        Tool(name="read_file", description="Read a file", function=read_file,
             parameters=[Param("path", "string", required=True), Param("offset", "integer")]),
        Tool(name="add", description="Add two numbers", function=add, concurrent=True,
             parameters=[Param("a", "number", required=True), Param("b", "number", required=True)]),
    ])


@dataclass
class Answer:
    """What the client got, the same way for streamed and plain responses."""

    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str | None
    usage: dict[str, Any] | None
    headers: dict[str, str]
    chunks: int = 0


@dataclass
class Stack:
    url: str
    http: TestClient[web.Request, web.Application]  # raw HTTP to the gateway (pytest-aiohttp)
    client: AsyncOpenAI
    model: ScriptedModel
    script: Script
    exporter: InMemorySpanExporter
    metrics: CollectorRegistry
    observability: Observability

    @property
    def upstream_requests(self) -> list[dict[str, Any]]:
        return self.model.requests

    def spans(self, trace_id: str | None = None) -> list[ReadableSpan]:
        found = list(self.exporter.get_finished_spans())
        if trace_id is not None:
            found = [s for s in found if format(s.context.trace_id, "032x") == trace_id]
        return sorted(found, key=lambda s: s.start_time or 0)

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics.get_sample_value(name, labels) or 0.0

    async def ask(self, stream: bool, **request: Any) -> Answer:
        request.setdefault("model", "test-model")
        if stream:
            request.setdefault("stream_options", {"include_usage": True})
            return await _ask_streamed(self.client, request)
        raw = await self.client.chat.completions.with_raw_response.create(**request)
        completion = raw.parse()
        choice = completion.choices[0]
        calls = [c.model_dump() for c in choice.message.tool_calls or []]
        return Answer(choice.message.content, calls, choice.finish_reason,
                      completion.usage.model_dump() if completion.usage else None, dict(raw.headers))


async def _ask_streamed(client: AsyncOpenAI, request: dict[str, Any]) -> Answer:
    raw = await client.chat.completions.with_raw_response.create(stream=True, **request)
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    usage = None
    count = 0
    async for chunk in raw.parse():
        count += 1
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
        for choice in chunk.choices:
            if choice.delta.content:
                content.append(choice.delta.content)
            for part in choice.delta.tool_calls or []:
                call = calls.setdefault(part.index, {"id": None, "type": "function",
                                                     "function": {"name": "", "arguments": ""}})
                call["id"] = call["id"] or part.id
                if part.function is not None:
                    call["function"]["name"] += part.function.name or ""
                    call["function"]["arguments"] += part.function.arguments or ""
            finish = choice.finish_reason or finish
    return Answer("".join(content) or None, [calls[i] for i in sorted(calls)], finish, usage, dict(raw.headers),
                  count)


def tree(spans: list[ReadableSpan]) -> dict[str, Any]:
    """The span tree in a comparable form: the root SERVER span, its children by name."""
    [root] = [s for s in spans if s.parent is None]
    assert root.kind is SpanKind.SERVER
    children = [s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id]
    return {"root": root, "chat": [s for s in children if s.name.startswith(names.SPAN_CHAT_PREFIX + " ")],
            "tool_calls": [s for s in children if s.name == names.SPAN_TOOL_CALL]}


def tool_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body["messages"] if m.get("role") == "tool"]


def call_args(call: dict[str, Any]) -> Any:
    return json.loads(call["function"]["arguments"])


StackFactory = Callable[..., Awaitable[Stack]]


@pytest.fixture
async def make_stack(aiohttp_server: AiohttpServer, aiohttp_client: AiohttpClient) -> AsyncIterator[StackFactory]:
    """Builds a stack; keyword arguments are Settings overrides, `registry=` the tools."""
    async with AsyncExitStack() as exits:
        async def build(registry: ToolRegistry | None = None, **overrides: Any) -> Stack:
            exporter = InMemorySpanExporter()
            script = Script()
            model = ScriptedModel(script)
            upstream = await aiohttp_server(model.app())
            model.base_url = str(upstream.make_url("")).rstrip("/")
            settings = Settings(port=0, upstream=str(upstream.make_url("/v1")), **overrides)
            observability = build_telemetry(settings, [SimpleSpanProcessor(exporter)], "toolspan.scripted")
            if observability.provider is not None:
                exits.callback(observability.provider.shutdown)
            app = create_app(settings, registry if registry is not None else sample_registry(),
                             observability.instrumentation)
            server = await aiohttp_server(app)
            url = str(server.make_url("")).rstrip("/")
            client = AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-test-key", max_retries=0, timeout=20)
            exits.push_async_callback(client.close)
            metrics = getattr(observability.instrumentation, "metrics", None)
            return Stack(url, await aiohttp_client(server), client, model, script, exporter,
                         metrics.registry if metrics else CollectorRegistry(), observability)

        yield build


@pytest.fixture
async def stack(make_stack: StackFactory) -> Stack:
    return await make_stack()
