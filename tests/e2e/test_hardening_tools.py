"""Hardening, the tool side (issue 10): odd text in a model's arguments, a caller's own custom
tools, arguments sent as an object in a stream, and the bounded thread pool for sync tools. Issue
53: a client's tool schema that refers to a URL is never fetched, and hostile schemas (references
fanning out, `uniqueItems` over huge arrays) are checked at a bounded cost, off the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import math
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from openai import AsyncOpenAI
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.demo.model import Reply
from gateway.runtime.process import gateway
from gateway.settings.model import Settings
from gateway.tools import Param, Tool, ToolRegistry
from telemetry import names
from tests.conftest import (
    AUTH,
    STREAM,
    USER,
    Script,
    StackFactory,
    sample_registry,
    settled_garbage_collector,
    tool_call_spans,
    tool_messages,
    tool_outcomes,
)


def sse(*events: dict[str, Any]) -> bytes:
    """A recorded stream: these events, as a provider writes them, then [DONE]."""
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-rec", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def completion(message: dict[str, Any], finish: str) -> bytes:
    return json.dumps({"id": "chatcmpl-rec", "object": "chat.completion", "created": 1, "model": "m",
                       "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                       "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()


async def chat(stack: Any, stream: bool, **request: Any) -> tuple[int, list[dict[str, Any]]]:
    """Raw HTTP to /v1/chat/completions: the status and the JSON body (or the stream's events)."""
    body = {"model": "m", "messages": USER, "stream": stream, **request}
    async with stack.http.post("/v1/chat/completions", json=body, headers=AUTH) as response:
        text = await response.text()
        if not stream:
            return response.status, [json.loads(text)]
        return response.status, [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


# --- item 4: a lone surrogate in the arguments, echoed by a tool --------------------------------------

def echo(args: dict[str, Any]) -> str:
    return str(args["text"])


def echo_registry() -> ToolRegistry:
    registry = sample_registry()
    registry.register(Tool(name="echo", function=echo, parameters=[Param("text", "string", required=True)]))
    return registry


LONE = '{"text": "a\\udcffb"}'  # JSON text: a lone low surrogate, as a JSON escape


def saw_replacement(body: dict[str, Any]) -> Reply:
    """The model's next turn: the echoed text reached it, with U+FFFD for the lone surrogate."""
    [result] = [m["content"] for m in body["messages"] if m.get("role") == "tool"]
    assert result == "a\ufffdb", result
    return Reply(content="echoed")


@STREAM
async def test_chat_a_lone_surrogate_echoed_by_a_tool_completes(make_stack: StackFactory, stream: bool) -> None:
    stack = await make_stack(registry=echo_registry())
    stack.script.then(Reply(tool_calls=[("echo", LONE)]), saw_replacement)
    answer = await stack.ask(stream, messages=USER)
    assert answer.content == "echoed"
    assert tool_messages(stack.upstream_requests[1])[0]["content"] == "a\ufffdb"
    trace = answer.headers["x-trace-id"]
    assert tool_outcomes(stack, trace) == [("echo", "ok")]


@STREAM
async def test_responses_a_lone_surrogate_echoed_by_a_tool_completes(make_stack: StackFactory, stream: bool) -> None:
    stack = await make_stack(registry=echo_registry())
    stack.script.then(Reply(tool_calls=[("echo", LONE)]), saw_replacement)
    answer = await stack.respond(stream, input="echo it")
    assert answer.text == "echoed"
    [output] = [i for i in stack.upstream_requests[1]["input"] if i.get("type") == "function_call_output"]
    assert output["output"] == "a\ufffdb"


# --- item 5: the caller's own custom (free-form) tools --------------------------------------------------

GRAMMAR = {"type": "custom", "custom": {"name": "grammar", "description": "SQL in a grammar"}}
CUSTOM_CALL = {"id": "call_c1", "type": "custom", "custom": {"name": "grammar", "input": "SELECT 1"}}


async def test_chat_a_custom_call_reaches_the_client(make_stack: StackFactory) -> None:
    stack = await make_stack()
    stack.script.then(Reply(raw=completion({"role": "assistant", "content": None, "tool_calls": [CUSTOM_CALL]},
                                           "tool_calls")))
    status, [body] = await chat(stack, False, tools=[GRAMMAR])
    assert status == 200, body
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"] == [CUSTOM_CALL]
    assert len(stack.upstream_requests) == 1  # the gateway ran nothing and asked nothing more
    assert not tool_call_spans(stack, None)  # the gateway ran nothing (the client's call is only checked)


async def test_chat_a_streamed_custom_call_reaches_the_client(make_stack: StackFactory) -> None:
    stack = await make_stack()
    head = {"index": 0, "id": "call_c1", "type": "custom", "custom": {"name": "grammar", "input": ""}}
    stack.script.then(Reply(raw_stream=sse(
        chunk({"role": "assistant", "content": None}),
        chunk({"tool_calls": [head]}),
        chunk({"tool_calls": [{"index": 0, "custom": {"input": "SELECT"}}]}),
        chunk({"tool_calls": [{"index": 0, "custom": {"input": " 1"}}]}),
        chunk({}, "tool_calls"))))
    status, events = await chat(stack, True, tools=[GRAMMAR])
    assert status == 200, events
    assert not [e for e in events if "error" in e], events
    parts = [p for e in events for c in e.get("choices", []) for p in c["delta"].get("tool_calls") or []]
    assert [p.get("type") for p in parts if p.get("id")] == ["custom"]
    assert parts[0]["id"] == "call_c1"
    assert parts[0]["custom"]["name"] == "grammar"
    assert "".join(p["custom"].get("input", "") for p in parts) == "SELECT 1"
    assert [c["finish_reason"] for e in events for c in e.get("choices", []) if c.get("finish_reason")] == [
        "tool_calls"]
    assert len(stack.upstream_requests) == 1
    assert not tool_call_spans(stack, None)  # not run as an unknown tool (the client's call is only checked)


@STREAM
async def test_chat_a_custom_call_beside_a_gateway_call(make_stack: StackFactory, stream: bool) -> None:
    """The gateway runs its own call and hands the client its custom one, in both stream modes."""
    stack = await make_stack()
    add = {"id": "call_a1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    if stream:
        stack.script.then(Reply(raw_stream=sse(
            chunk({"role": "assistant", "content": None}),
            chunk({"tool_calls": [{"index": 0, **add}]}),
            chunk({"tool_calls": [{"index": 1, **CUSTOM_CALL}]}),
            chunk({}, "tool_calls"))))
    else:
        stack.script.then(Reply(raw=completion({"role": "assistant", "content": None, "tool_calls": [add, CUSTOM_CALL]},
                                               "tool_calls")))
    status, events = await chat(stack, stream, tools=[GRAMMAR])
    assert status == 200, events
    if stream:
        parts = [p for e in events for c in e.get("choices", []) for p in c["delta"].get("tool_calls") or []]
        [call] = [p for p in parts if p.get("id")]
    else:
        [call] = events[0]["choices"][0]["message"]["tool_calls"]
    assert call["type"] == "custom"
    assert call["custom"]["name"] == "grammar"
    assert call["id"].endswith("call_c1")  # under an id naming the held turn
    trace = tool_call_spans(stack, None)
    assert [(s.attributes or {})[names.ATTR_TOOL_NAME] for s in trace] == ["add"]
    [custom] = tool_call_spans(stack, None, side=names.SIDE_CLIENT)
    assert (custom.attributes or {})[names.ATTR_OUTCOME] == "unchecked"  # not a function tool: nothing to check


# --- item 11: arguments sent as an object, in a stream -------------------------------------------------

async def test_streamed_object_arguments_reach_the_tool(make_stack: StackFactory) -> None:
    stack = await make_stack()
    head = {"index": 0, "id": "call_a1", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
    stack.script.then(Reply(raw_stream=sse(chunk({"role": "assistant", "content": None}), chunk({"tool_calls": [head]}),
                                           chunk({}, "tool_calls"))),
                      Reply(content="5"))
    answer = await stack.ask(True, messages=USER)
    assert answer.content == "5"
    assert [m["content"] for m in tool_messages(stack.upstream_requests[1])] == ["5"]
    assert tool_outcomes(stack, answer.headers["x-trace-id"]) == [("add", "ok")]


# --- item 6: a bounded pool of threads for sync tools ---------------------------------------------------

@STREAM
async def test_a_full_tool_pool_is_a_busy_outcome_not_a_stall(make_stack: StackFactory, stream: bool) -> None:
    release = threading.Event()
    started = threading.Semaphore(0)

    def stuck(args: dict[str, Any]) -> str:
        started.release()
        release.wait()
        return "late"

    registry = sample_registry()
    registry.register(Tool(name="stuck", function=stuck, timeout=0.05))
    stack = await make_stack(registry=registry, tool_threads=2)
    try:
        stack.script.then(Reply(tool_calls=[("stuck", {}), ("stuck", {}), ("read_file", {"path": "a"})]),
                          Reply(content="done"))
        answer = await asyncio.wait_for(stack.ask(stream, messages=USER), 10)
        assert answer.content == "done"
        results = [m["content"] for m in tool_messages(stack.upstream_requests[1])]
        assert [r.startswith("Tool 'stuck' did not finish") for r in results[:2]] == [True, True]
        assert results[2] == ("Tool 'read_file' is busy and did not run: all 2 threads for tools are held by "
                              "earlier calls that did not finish. Try again later.")
        trace = answer.headers["x-trace-id"]
        assert tool_outcomes(stack, trace) == [("stuck", "timeout"), ("stuck", "timeout"), ("read_file", "error")]
        [busy] = [s for s in stack.spans(trace) if s.name == names.SPAN_TOOL_CALL
                  and (s.attributes or {})[names.ATTR_TOOL_NAME] == "read_file"]
        assert (busy.attributes or {})[names.ATTR_ERROR_TYPE] == "tool_busy"
    finally:
        release.set()


CUSTOM_ITEM = {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_c1", "name": "grammar",
               "input": "SELECT 1", "status": "completed"}


def response(status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": "resp_rec", "object": "response", "created_at": 1, "model": "m", "status": status,
            "output": output, "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}}


@STREAM
async def test_responses_a_custom_call_reaches_the_client(make_stack: StackFactory, stream: bool) -> None:
    stack = await make_stack()
    if stream:
        added = {**CUSTOM_ITEM, "input": "", "status": "in_progress"}
        stack.script.then(Reply(raw_stream=sse(
            {"type": "response.created", "response": response("in_progress", [])},
            {"type": "response.output_item.added", "output_index": 0, "item": added},
            {"type": "response.custom_tool_call_input.delta", "output_index": 0, "item_id": "ctc_1",
             "delta": "SELECT 1"},
            {"type": "response.output_item.done", "output_index": 0, "item": CUSTOM_ITEM},
            {"type": "response.completed", "response": response("completed", [CUSTOM_ITEM])})))
    else:
        stack.script.then(Reply(raw=json.dumps(response("completed", [CUSTOM_ITEM])).encode()))
    body = {"model": "m", "input": "query", "stream": stream,
            "tools": [{"type": "custom", "name": "grammar", "description": "SQL in a grammar"}]}
    async with stack.http.post("/v1/responses", json=body, headers=AUTH) as answer:
        assert answer.status == 200
        text = await answer.text()
    if stream:
        events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
        assert not [e for e in events if e.get("type") == "error"], events
        final = events[-1]["response"]
    else:
        final = json.loads(text)
    assert [(i["type"], i["call_id"], i["input"]) for i in final["output"]] == [
        ("custom_tool_call", "call_c1", "SELECT 1")]
    assert len(stack.upstream_requests) == 1
    assert not tool_call_spans(stack, None)  # the gateway ran nothing (the client's call is only checked)


# --- issue 53, items 1 and 2: a client's tool schema is data, checked at a bounded cost ---------------

class Listener:
    """A plain asyncio server on a loopback port, on a thread and event loop of its own (so that a
    gateway blocking its own loop on a fetch still reaches it), counting the connections it gets.
    Each is answered with a schema whose enum holds MARKER, as a hostile server would answer."""

    def __init__(self) -> None:
        self.connections: list[bytes] = []  # the first bytes each connection sent
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._serve(),), daemon=True)
        self.port = 0

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections.append(await reader.read(2048))
        body = json.dumps({"type": "string", "enum": [MARKER]}).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/schema+json\r\nConnection: close\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        await writer.drain()
        writer.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()

    def __enter__(self) -> Listener:
        self._thread.start()
        assert self._ready.wait(10), "the listener did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        self._loop.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


MARKER = "fetched-from-the-listener"


def remote_schemas(url: str) -> dict[str, dict[str, Any]]:
    """Client schemas whose `path` refers to the listener, in each way jsonschema would fetch it."""
    return {"ref_to_url": {"type": "object", "properties": {"path": {"$ref": f"{url}/path.json"}},
                           "required": ["path"]},
            "id_and_relative_ref": {"$id": f"{url}/tool.json", "type": "object",
                                    "properties": {"path": {"$ref": "path.json"}}, "required": ["path"]},
            "dynamic_ref": {"type": "object", "properties": {"path": {"$dynamicRef": f"{url}/path.json#meta"}},
                            "required": ["path"]}}


@pytest.mark.parametrize("mode", ["observe", "reject"])
@pytest.mark.parametrize("form", ["ref_to_url", "id_and_relative_ref", "dynamic_ref"])
async def test_a_client_schema_referring_to_a_url_is_never_fetched(make_stack: StackFactory, mode: str,
                                                                   form: str) -> None:
    with Listener() as listener:
        stack = await make_stack(client_tool_check=mode)
        tool = {"type": "function", "function": {"name": "open_file", "parameters": remote_schemas(listener.url)[form]}}
        # a wrong value: checking it would follow the reference (and quote what it returned)
        stack.script.then(Reply(tool_calls=[("open_file", {"path": 7})]), Reply(content="answered"))
        answer = await stack.ask(False, messages=USER, tools=[tool])
        assert listener.connections == []
    [call] = answer.tool_calls  # not checked, so handed to the client as sent, in reject mode too
    assert json.loads(call["function"]["arguments"]) == {"path": 7}
    assert len(stack.upstream_requests) == 1
    assert MARKER not in json.dumps(stack.upstream_requests)
    [span] = tool_call_spans(stack, answer.headers["x-trace-id"], side=names.SIDE_CLIENT)
    attributes = dict(span.attributes or {})
    assert (attributes[names.ATTR_OUTCOME], attributes[names.ATTR_UNCHECKED_REASON]) == ("unchecked", "remote_ref")
    assert stack.metric(names.METRIC_TOOL_UNCHECKED, tool="open_file", reason="remote_ref",
                        side=names.SIDE_CLIENT) == 1


def fan_out(levels: int, salt: int) -> dict[str, Any]:
    """A few KiB of schema whose each level refers twice to the next: checking any value against it
    applies 2**levels subschemas. `salt` makes each a schema of its own (not one compiled before)."""
    defs: dict[str, Any] = {f"l{i}": {"allOf": [{"$ref": f"#/$defs/l{i + 1}"}, {"$ref": f"#/$defs/l{i + 1}"}]}
                            for i in range(levels)}
    defs[f"l{levels}"] = {"type": "string"}
    return {"type": "object", "description": f"variant {salt}", "$defs": defs,
            "properties": {"query": {"$ref": "#/$defs/l0"}}}


UNIQUE_OBJECTS = {"type": "object", "properties": {"rows": {"type": "array", "uniqueItems": True}}}
# Not JSON Schema: `type` holds objects. jsonschema's metaschema says its items are unique (inside an
# anyOf, which goes on past the first failure) and compared them in pairs when the schema was compiled.
TYPES_OF_OBJECTS = {"type": "object", "properties": {"kind": {"type": [{"name": i} for i in range(1_500)]}}}


def rows(count: int) -> str:
    return json.dumps({"rows": [{"id": i} for i in range(count)]})  # objects: jsonschema compares each pair


def completion_calling(tool: str, arguments: str) -> bytes:
    """A provider's answer calling `tool`, written before the test (the scripted model shares the
    gateway's event loop: building a large answer there would count against the gateway)."""
    return json.dumps({"id": "chatcmpl-hostile", "object": "chat.completion", "created": 1, "model": "m",
                       "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                           "role": "assistant", "content": None, "tool_calls": [
                               {"id": "call_h", "type": "function",
                                "function": {"name": tool, "arguments": arguments}}]}}],
                       "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()


@dataclass
class LiveStack:
    """The gateway and its scripted model on an event loop of their own, in a thread: the test's
    loop stays free to measure it (and to give up on it, should it stall)."""

    url: str
    script: Script
    exporter: InMemorySpanExporter


@contextlib.asynccontextmanager
async def live_stack(tmp_path: Path) -> AsyncIterator[LiveStack]:
    script, exporter = Script(), InMemorySpanExporter()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    found: dict[str, Any] = {}

    async def serve() -> None:
        found["stop"] = asyncio.Event()
        settings = Settings(port=0, trajectory_store_path=tmp_path / "store.sqlite3")
        async with gateway(settings, policy=script, processors=[SimpleSpanProcessor(exporter)]) as (url, _, _):
            found["url"] = url
            started.set()
            await found["stop"].wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert await asyncio.to_thread(started.wait, 30), "the gateway did not start"
    try:
        yield LiveStack(found["url"], script, exporter)
    finally:
        loop.call_soon_threadsafe(found["stop"].set)
        await asyncio.to_thread(thread.join, 30)
        if not thread.is_alive():  # a gateway stuck in a check (the code before issue 53) is left to the exit
            loop.close()


PROBE_LIMIT = 5.0  # a probe waiting this long means the gateway's loop is stuck: the measure stops there


def probe_healthz(url: str, done: threading.Event) -> list[float]:
    """Seconds each GET /healthz took, one after another on one connection, until `done`; an
    unanswered probe ends the list (as infinity). Run on a thread of its own, so that what the
    test's own event loop does (its client reading answers) is not counted against the gateway."""
    address = urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname or "127.0.0.1", address.port, timeout=PROBE_LIMIT)
    latencies: list[float] = []
    try:
        while not done.is_set():
            started = time.perf_counter()
            try:
                connection.request("GET", "/healthz")
                with connection.getresponse() as response:
                    response.read()
            except TimeoutError:
                return [*latencies, math.inf]
            assert response.status == 200
            latencies.append(time.perf_counter() - started)
    finally:
        connection.close()
    return latencies


async def healthz_while(url: str, work: Callable[[], Awaitable[Any]]) -> list[float]:
    """probe_healthz from when `work()` starts until it is done; should a probe go unanswered,
    the work is abandoned."""
    done = threading.Event()
    probing = asyncio.ensure_future(asyncio.to_thread(probe_healthz, url, done))
    task = asyncio.ensure_future(work())
    await asyncio.wait({task, probing}, return_when=asyncio.FIRST_COMPLETED)
    done.set()
    latencies = await probing
    if not task.done():  # the gateway stopped answering
        task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    if not task.cancelled():
        task.result()  # the work's own failure, if it failed rather than being given up
    return latencies


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


async def test_healthz_stays_fast_while_hostile_client_schemas_are_checked(tmp_path: Path) -> None:
    """Five requests declaring a 30-level fan-out of references (each a schema not seen before),
    then calls sending 100,000 objects to a `uniqueItems` array (past what is read at all) and
    8,000 (checked, off the loop), then a schema whose `type` lists 1,500 objects: each check is
    bounded, and /healthz keeps answering meanwhile."""
    hostile = [(fan_out(30, salt), json.dumps({"query": "x"})) for salt in range(5)] + [
        (UNIQUE_OBJECTS, rows(100_000)), (UNIQUE_OBJECTS, rows(8_000)), (TYPES_OF_OBJECTS, json.dumps({"kind": 1}))]
    async with live_stack(tmp_path) as live, settled_garbage_collector():
        live.script.then(*(Reply(raw=completion_calling("lookup", arguments)) for _, arguments in hostile))
        client = AsyncOpenAI(base_url=f"{live.url}/v1", api_key="sk-test", max_retries=0, timeout=60)
        await client.models.list()  # the client's own start-up (its connection pool, TLS defaults) done

        async def ask_each() -> list[str]:
            traces = []
            for schema, _ in hostile:
                tool = {"type": "function", "function": {"name": "lookup", "parameters": schema}}
                raw = await client.chat.completions.with_raw_response.create(model="m", messages=USER, tools=[tool])
                assert raw.parse().choices[0].message.tool_calls  # handed to the client as the model sent it
                traces.append(raw.headers["x-trace-id"])
            return traces

        try:
            latencies = await healthz_while(live.url, ask_each)
        finally:
            await client.close()
        assert math.inf not in latencies, "a /healthz probe went unanswered: the gateway's loop was held"
        assert p99(latencies) < 0.05, sorted(latencies)[-5:]
        checks = [dict(s.attributes or {}) for s in live.exporter.get_finished_spans()
                  if s.name == names.SPAN_TOOL_CALL]
        assert [(c[names.ATTR_OUTCOME], c.get(names.ATTR_UNCHECKED_REASON)) for c in checks] == (
            [("unchecked", "too_complex")] * 6 + [("ok", None), ("unchecked", "invalid_schema")])
