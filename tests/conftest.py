"""Shared test helpers: the whole gateway served by pytest-aiohttp's `aiohttp_server`, an
in-process scripted upstream, the real openai client, and an aiohttp test client."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import json
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import anthropic
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from openai import AsyncOpenAI
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from playwright.async_api import Browser, async_playwright
from prometheus_client import CollectorRegistry
from pydantic import SecretStr
from pytest_aiohttp import AiohttpClient, AiohttpServer

from gateway.apis.chat.answer import ChatStreamReader
from gateway.apis.messages.answer import MessagesStreamReader
from gateway.apis.responses.answer import ResponsesStreamReader
from gateway.app import create_app
from gateway.demo.model import Reply, ScriptedModel
from gateway.engine.turn import ModelTurn
from gateway.http.keys import APPROVALS
from gateway.provider.sse import sse_events
from gateway.runtime.logs import configure_logging
from gateway.runtime.process import Observability, build_telemetry, settle_garbage_collector
from gateway.settings.model import Settings
from gateway.settings.parts import GatewayKey
from gateway.state import StateStore, StateUnavailable
from gateway.tools import Interrupt, Param, Tool, ToolError, ToolRegistry
from telemetry import names
from telemetry.store.writer import TrajectoryStore

if TYPE_CHECKING:
    from tests.e2e.redis_server import RedisServer  # which imports this module

pytest_plugins = ["tests.e2e.redis_server"]  # a real redis-server, for the tests that share state

E2E = Path(__file__).parent / "e2e"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every black-box run (tests/e2e: real processes, browsers, CLIs, Redis, Prometheus) is `slow`, as
    are the modules elsewhere that mark themselves so: `pytest -m "not slow"` is the quick loop."""
    for item in items:
        if item.path.is_relative_to(E2E):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _data_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test's (and its subprocesses') home and user data directory are temporary ones: a
    gateway's trajectory store, on by default, lands there, and nothing the user runs (their own
    `toolspan serve` writing ~/.local/share/toolspan) can be read by a test or fail it."""
    home = tmp_path_factory.mktemp("home")
    data = home / ".local" / "share"
    data.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_DATA_HOME", str(data))
    return data


@pytest.fixture(autouse=True)
def _no_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy variable of the machine's reaches a test: a gateway reads them (gateway.provider.route)
    and so does the openai client, and a test's loopback provider is not behind a proxy."""
    for name in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY",
                 "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)


USER = [{"role": "user", "content": "hello"}]  # the one user message a request needs
STREAM = pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
TEST_KEY = "sk-test-key"  # the key a stack's openai client sends
AUTH = {"Authorization": f"Bearer {TEST_KEY}"}
REMOTE_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"  # a caller's trace, as W3C's example has it
REMOTE_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{REMOTE_TRACE}-{REMOTE_SPAN}-01"


class Clock:
    """A clock a test moves (`clock.now += 30`), handed where a monotonic or wall clock is taken."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


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


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No TOOLSPAN_* or OTEL_* variable from the machine running the tests."""
    for name in list(os.environ):
        if name.upper().startswith(("TOOLSPAN_", "OTEL_")):
            monkeypatch.delenv(name)
    return monkeypatch


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


# --- tool bodies for every outcome ------------------------------------------------------------------

async def hang(args: dict[str, Any]) -> str:
    """Never finishes: only a timeout or a cancellation ends it."""
    await asyncio.Event().wait()
    return "never"


async def crash(args: dict[str, Any]) -> str:
    raise ValueError("disk on fire")


async def locked(args: dict[str, Any]) -> str:
    raise ToolError("the file is locked")


async def review(args: dict[str, Any]) -> str:
    raise Interrupt("needs a human", data={"ticket": "T-1"})


def reject_relative(args: dict[str, Any]) -> None:
    """A tool's own argument parser: refuses a relative `path`."""
    if not str(args.get("path", "")).startswith("/"):
        raise ToolError("path must be absolute")


def every_outcome_registry() -> ToolRegistry:
    """`sample_registry()` and a tool for each other outcome: `locked` and `crash` (error), `slow`
    (timeout), `review` (interrupted), `strict` (its parser rejects a relative path), `checked` (its
    values checked against its schema: schema_violation) and `admin` (for an allowlist to leave
    out: not_allowed)."""
    registry = sample_registry()
    for tool in (Tool(name="locked", function=locked), Tool(name="crash", function=crash),
                 Tool(name="slow", function=hang, timeout=0.05), Tool(name="review", function=review),
                 Tool(name="strict", parameters=[Param("path", "string", required=True)],
                      parse_args=reject_relative, function=lambda a: "ok"),
                 Tool(name="admin", function=lambda a: "secret"),
                 Tool(name="checked", parameters=[Param("n", "integer", required=True)], validate_schema=True,
                      function=lambda a: a["n"])):
        registry.register(tool)
    return registry


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
class ResponseAnswer:
    """What a Responses API client got, the same way for streamed and plain responses."""

    id: str
    output: list[dict[str, Any]]
    text: str
    usage: dict[str, Any] | None
    status: str | None
    previous_response_id: str | None
    tools: list[dict[str, Any]]
    headers: dict[str, str]
    events: list[dict[str, Any]]  # the stream's events as the client parsed them ([] when not streamed)

    @property
    def calls(self) -> list[dict[str, Any]]:
        return [item for item in self.output if item["type"] == "function_call"]


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
    upstream_server: TestServer | None = None  # the scripted model's server, for `aiohttp_client`

    @property
    def upstream_requests(self) -> list[dict[str, Any]]:
        return self.model.requests

    def spans(self, trace_id: str | None = None) -> list[ReadableSpan]:
        return spans_of(self.exporter, trace_id)

    def metric(self, name: str, **labels: str) -> float:
        return metric_sum(self.metrics, name, **labels)

    @property
    def store(self) -> TrajectoryStore:
        assert self.observability.store is not None, "this stack has no trajectory store"
        return self.observability.store

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


    def anthropic(self, api_key: str = TEST_KEY, **options: Any) -> anthropic.AsyncAnthropic:
        """Anthropic's client, pointed at the gateway (the test closes it: `async with`)."""
        return anthropic.AsyncAnthropic(base_url=self.url, api_key=api_key, max_retries=0, timeout=20, **options)

    async def respond(self, stream: bool, **request: Any) -> ResponseAnswer:
        """One `client.responses.create` call through the gateway."""
        request.setdefault("model", "test-model")
        raw = await self.client.responses.with_raw_response.create(stream=stream, **request)
        events: list[dict[str, Any]] = []
        if stream:
            async for event in raw.parse():
                events.append(event.model_dump(exclude_unset=True))
            response = events[-1]["response"]
        else:
            response = raw.parse().model_dump(exclude_unset=True)
        return ResponseAnswer(response["id"], response["output"], "".join(
            part.get("text", "") for item in response["output"] if item["type"] == "message"
            for part in item["content"]), response.get("usage"), response.get("status"),
            response.get("previous_response_id"), response.get("tools") or [], dict(raw.headers), events)


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


# --- finding spans ----------------------------------------------------------------------------------

class Traced(Protocol):
    """What recorded spans: a `Stack` or a `Gateway`."""

    def spans(self, trace_id: str | None = None) -> list[ReadableSpan]: ...


def metric_sum(registry: CollectorRegistry, sample_name: str, **labels: str) -> float:
    """The sum of the samples named `sample_name` whose labels include `labels` (a tool metric's
    `side` need not be named, say: both sides are summed)."""
    return sum(sample.value for family in registry.collect() for sample in family.samples
               if sample.name == sample_name and labels.items() <= sample.labels.items())


def spans_of(exporter: InMemorySpanExporter, trace_id: str | None = None) -> list[ReadableSpan]:
    """The ended spans (of one trace, given its hex id), in the order they started."""
    found = list(exporter.get_finished_spans())
    if trace_id is not None:
        found = [s for s in found if format(s.context.trace_id, "032x") == trace_id]
    return sorted(found, key=lambda s: s.start_time or 0)


def server_span(traced: Traced, trace_id: str) -> ReadableSpan:
    """The one SERVER span of a trace."""
    [span] = [s for s in traced.spans(trace_id) if s.kind is SpanKind.SERVER]
    return span


def tool_call_spans(traced: Traced, trace_id: str, side: str = names.SIDE_GATEWAY) -> list[ReadableSpan]:
    """The tool.call spans of a trace of one side: the gateway's own calls, or the client's calls it checked."""
    return [s for s in traced.spans(trace_id) if s.name == names.SPAN_TOOL_CALL
            and (s.attributes or {}).get(names.ATTR_TOOL_SIDE) == side]


def tool_outcomes(traced: Traced, trace_id: str, side: str = names.SIDE_GATEWAY) -> list[tuple[str, str]]:
    """(tool, outcome) of each tool.call span of `side` under the request's root span, in order."""
    return [(str((s.attributes or {})[names.ATTR_TOOL_NAME]), str((s.attributes or {})[names.ATTR_OUTCOME]))
            for s in tree(traced.spans(trace_id))["tool_calls"]
            if (s.attributes or {}).get(names.ATTR_TOOL_SIDE) == side]


async def toolspan_cli(*args: str) -> str:
    """`toolspan ...` in a process of its own (the test's environment, its temporary data home
    included); what it printed. It must succeed."""
    process = await asyncio.create_subprocess_exec(sys.executable, "-m", "gateway", *args,
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return out.decode()


def free_port() -> int:
    """A port nothing listens on (for a provider that is not there, or a process of our own)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


# --- the gateway under test -------------------------------------------------------------------------

@dataclass
class Gateway:
    """The gateway alone, served by `aiohttp_server`: its provider is wherever the settings say."""

    url: str
    http: TestClient[web.Request, web.Application]  # raw HTTP to the gateway (pytest-aiohttp)
    client: AsyncOpenAI
    exporter: InMemorySpanExporter
    metrics: CollectorRegistry
    observability: Observability

    def spans(self, trace_id: str | None = None) -> list[ReadableSpan]:
        return spans_of(self.exporter, trace_id)

    def metric(self, name: str, **labels: str) -> float:
        return metric_sum(self.metrics, name, **labels)


async def _serve_gateway(exits: AsyncExitStack, aiohttp_server: AiohttpServer, aiohttp_client: AiohttpClient,
                         settings: Settings, registry: ToolRegistry | None, provider_name: str | None) -> Gateway:
    """`create_app` with the telemetry `build_telemetry` makes of the settings (its spans kept in
    memory as well), on `aiohttp_server`; `exits` shuts the tracer provider and the openai client."""
    exporter = InMemorySpanExporter()
    if provider_name is not None and settings.upstream_provider_name is None:  # the upstream's, as named
        settings = settings.model_copy(update={"upstream_provider_name": provider_name})
    observability = build_telemetry(settings, [SimpleSpanProcessor(exporter)])
    if observability.provider is not None:
        exits.callback(observability.provider.shutdown)
    if observability.log_provider is not None:
        exits.callback(observability.log_provider.shutdown)
    app = create_app(settings, registry if registry is not None else sample_registry(), observability.instrumentation,
                     observability.state, observability.trajectory_reader())
    server = await aiohttp_server(app)
    exits.push_async_callback(_nothing_pending, observability.state)  # run before the server stops
    url = str(server.make_url("")).rstrip("/")
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key=TEST_KEY, max_retries=0, timeout=20)
    exits.push_async_callback(client.close)
    metrics = getattr(observability.instrumentation, "metrics", None)
    return Gateway(url, await aiohttp_client(server), client, exporter,
                   metrics.registry if metrics else CollectorRegistry(), observability)


async def _nothing_pending(state: StateStore) -> None:
    """After any test, no tool call is left waiting for approval (gateway.tools.approval_gate)."""
    try:
        held = await state.approvals.held()
    except StateUnavailable:  # a test that stopped its Redis: nothing to look at
        return
    assert held == [], f"approvals left pending after the test: {held}"


StackFactory = Callable[..., Awaitable[Stack]]
GatewayFactory = Callable[..., Awaitable[Gateway]]


@pytest.fixture
async def make_stack(aiohttp_server: AiohttpServer, aiohttp_client: AiohttpClient,
                     tmp_path: Path) -> AsyncIterator[StackFactory]:
    """Builds a stack; keyword arguments are Settings overrides, `registry=` the tools. Its
    trajectory store is a file of its own under the test's tmp_path."""
    built = itertools.count()
    async with AsyncExitStack() as exits:
        async def build(registry: ToolRegistry | None = None, **overrides: Any) -> Stack:
            overrides.setdefault("trajectory_store_path", tmp_path / f"store-{next(built)}.sqlite3")
            script = Script()
            model = ScriptedModel(script)
            upstream = await aiohttp_server(model.app())
            model.base_url = str(upstream.make_url("")).rstrip("/")
            # An Azure-style provider is named by its endpoint; the others by their /v1 base. The scripted
            # model serves every wire API: of the kinds, "compatible" says so (openai would refuse Messages).
            overrides.setdefault("upstream_kind", "compatible")
            base = "" if overrides.get("upstream_kind") == "azure" else "/v1"
            settings = Settings(port=0, upstream=str(upstream.make_url(base)).rstrip("/"), **overrides)
            gateway = await _serve_gateway(exits, aiohttp_server, aiohttp_client, settings, registry,
                                           settings.upstream_provider_name or "toolspan.scripted")
            return Stack(gateway.url, gateway.http, gateway.client, model, script, gateway.exporter, gateway.metrics,
                         gateway.observability, upstream)

        yield build


@pytest.fixture
async def make_gateway(aiohttp_server: AiohttpServer, aiohttp_client: AiohttpClient) -> AsyncIterator[GatewayFactory]:
    """Builds the gateway alone on the given `Settings` (no scripted model), as `make_stack` does:
    `await make_gateway(settings, registry=None, provider_name=None)` (a name: the upstream's
    gen_ai.provider.name, unless the settings give one)."""
    async with AsyncExitStack() as exits:
        async def build(settings: Settings, registry: ToolRegistry | None = None,
                        provider_name: str | None = None) -> Gateway:
            return await _serve_gateway(exits, aiohttp_server, aiohttp_client, settings, registry, provider_name)

        yield build


@pytest.fixture
async def stack(make_stack: StackFactory) -> Stack:
    return await make_stack()


@pytest.fixture(params=["memory", "redis"])
def state(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Settings for the state in this process's memory, and in a real Redis."""
    if request.param == "memory":
        return {}
    redis: RedisServer = request.getfixturevalue("redis_server")
    if redis.process is None:  # an outage test that failed half-way
        redis.start()
    return {"state_url": redis.url}


# --- a real browser ---------------------------------------------------------------------------------

CHROMIUM = "/usr/bin/chromium"
# Every name under .test is 127.0.0.1 to this browser: a page can come from a site of its own (a
# second test server), and a name can point at the gateway as a DNS-rebinding page's name ends up doing.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--host-resolver-rules=MAP *.test 127.0.0.1"]


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    """Debian's headless Chromium, driven by Playwright (no browser of Playwright's own)."""
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        await launched.close()


# --- log lines as `toolspan serve` writes them ------------------------------------------------------

def installed_formatter(log_format: str) -> logging.Formatter:
    """The formatter `configure_logging` gives the process's log handler for `log_format`; every
    logger's handlers and level are left as they were."""
    def loggers() -> dict[str, logging.Logger]:
        named = logging.root.manager.loggerDict.items()
        return {"": logging.root} | {name: v for name, v in named if isinstance(v, logging.Logger)}

    levels, handlers = {name: logger.level for name, logger in loggers().items()}, logging.root.handlers
    logging.root.handlers = []  # `configure_logging` would close and remove pytest's own
    try:
        configure_logging("info", log_format)
        [handler] = logging.root.handlers
        handler.close()
        assert handler.formatter is not None
        return handler.formatter
    finally:
        logging.root.handlers = handlers
        for name, logger in loggers().items():
            logger.setLevel(levels.get(name, logging.NOTSET))


def log_lines(records: list[logging.LogRecord], formatter: logging.Formatter) -> list[str]:
    """The lines the records make in a log written with `formatter`."""
    return [line for record in records for line in formatter.format(record).split("\n")]


# --- a long trajectory ------------------------------------------------------------------------------

async def grow_trajectory(stack: Stack, trajectory_id: str, requests: int, *, key: str = TEST_KEY,
                          failing_at: int | None = None) -> list[str]:
    """`requests` requests through the gateway, each a read_file call and an answer, all naming
    `trajectory_id`, sent with the gateway key `key`; at request number `failing_at` (from 1) the
    model names the argument wrongly (a rejection), and the next request's call is its corrected
    retry. Returns the requests' trace ids, in order, once the store has written them."""
    traces = []
    for number in range(1, requests + 1):
        arguments = {"file_path": "/a"} if number == failing_at else {"path": "/a"}
        stack.script.then(Reply(tool_calls=[("read_file", arguments)]), Reply(content=f"answer {number}"))
        sent = await stack.http.post("/v1/chat/completions", json={"model": "test-model", "messages": USER},
                                     headers={"Authorization": f"Bearer {key}", "X-Trajectory-Id": trajectory_id})
        assert sent.status == 200, await sent.text()
        traces.append(sent.headers["X-Trace-Id"])
    await stack.store.flushed()
    return traces


# --- approvals: tools that wait for a reviewer, and the reviewer's side -------------------------------

PAID: list[dict[str, Any]] = []  # what the payment tool's body ran with, in a test
# A gateway key of an agent and the operator's, whose names show in decisions ("by boss").
AGENT, BOSS = "sk-agent-01", "sk-boss-001"
AGENT_AND_BOSS = {"agent": GatewayKey(key=SecretStr(AGENT)), "boss": GatewayKey(key=SecretStr(BOSS), operator=True)}


def pay(args: dict[str, Any]) -> str:
    PAID.append(args)
    return f"paid {args['amount']} to {args['to']}"


async def ask_manager(args: dict[str, Any]) -> str:
    raise Interrupt("a manager must confirm the refund", data={"order": args["order"], "api_key": "sk-secret"})


def approval_registry(timeout: float | None = None) -> ToolRegistry:
    return ToolRegistry([
        Tool(name="pay", description="Pay someone", function=pay, approval=True, approval_timeout=timeout,
             parameters=[Param("to", "string", required=True), Param("amount", "number", required=True)]),
        Tool(name="refund", description="Refund an order", function=ask_manager, approval_timeout=timeout,
             parameters=[Param("order", "string", required=True)]),
    ])


async def pending(stack: Stack, headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    response = await stack.http.get("/v1/approvals", headers=headers or AUTH)
    assert response.status == 200, await response.text()
    listed: list[dict[str, Any]] = (await response.json())["data"]
    return listed


async def until(stack: Stack, ready: Callable[[], Awaitable[Any]]) -> Any:
    """`ready()`'s first true answer, asked again at each change of the approvals."""
    approvals = stack.http.server.app[APPROVALS]
    async with asyncio.timeout(10):
        while True:
            changed = approvals.next_change()
            if found := await ready():
                return found
            await changed.wait()


async def first_pending(stack: Stack, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """The first approval listed (the request asking for it runs meanwhile)."""
    found: list[dict[str, Any]] = await until(stack, lambda: pending(stack, headers))
    return found[0]


async def decide(stack: Stack, approval_id: str, headers: dict[str, str] | None = None,
                 **decision: Any) -> tuple[int, dict[str, Any]]:
    response = await stack.http.post(f"/v1/approvals/{approval_id}", json=decision, headers=headers or AUTH)
    return response.status, await response.json()


Asking = Callable[[], Awaitable[Any]]


async def while_asking(ask: Asking, then: Callable[[], Awaitable[Any]]) -> Any:
    """Run `ask` (a client's request) and, while it waits, `then` (the reviewer); the request's answer."""
    asking = asyncio.ensure_future(ask())
    try:
        await then()
        return await asyncio.wait_for(asking, 20)
    finally:
        if not asking.done():
            asking.cancel()
            await asyncio.gather(asking, return_exceptions=True)


# --- the docs' telemetry page ---------------------------------------------------------------------

TELEMETRY_PAGE = Path(__file__).resolve().parents[1] / "docs" / "telemetry-and-trajectories.md"


def page_text() -> str:
    """The telemetry page's text, its line breaks read as spaces."""
    return " ".join(TELEMETRY_PAGE.read_text(encoding="utf-8").split())


# --- a provider's stream, read and assembled ---------------------------------------------------------

def _feed(pieces: Sequence[bytes]) -> list[dict[str, Any]]:
    """The events `pieces`, read one after the other from the connection, decode to."""
    async def reads() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece

    async def read() -> list[dict[str, Any]]:
        return [event async for event in sse_events(reads())]
    return asyncio.run(read())


def _assembled(events: list[dict[str, Any]]) -> tuple[list[Any], ModelTurn]:
    """What the client sees at once, and the turn, of a stream of Chat chunks, Responses events or
    Messages events."""
    kind = str(events[0].get("type", ""))
    reader = (ResponsesStreamReader() if kind.startswith("response.") else MessagesStreamReader() if kind
              else ChatStreamReader())
    shown = [piece for event in events if (piece := reader.absorb(event)) is not None]
    return shown, reader.turn()


@contextlib.asynccontextmanager
async def settled_garbage_collector() -> AsyncIterator[None]:
    """What `toolspan serve` does once it listens (runtime.settle_garbage_collector), undone after:
    the test process's own long-lived objects (pytest's, every module imported) out of the
    collector's view, whose full collections would otherwise stop every thread while it walks them."""
    threshold = gc.get_threshold()
    settle_garbage_collector()
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()
