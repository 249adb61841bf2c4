"""The engine alone, against the scripted upstream served by pytest-aiohttp: the events one run
yields, for both APIs and both stream modes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from pytest_aiohttp import AiohttpServer

from gateway.apis.chat import CHAT
from gateway.apis.responses import RESPONSES
from gateway.apis.responses.answer import read_response
from gateway.caller import Caller
from gateway.demo.model import Reply, ScriptedModel
from gateway.engine import Engine, Event, Finished, Keepalive, Opened, Plan, ToolsRan, ToolsStarted, Visible
from gateway.engine.replays import Replays
from gateway.instrumentation import NoInstrumentation
from gateway.provider.client import Upstream
from gateway.provider.upstreams import Upstreams
from gateway.state import MemoryState
from gateway.tools import Tool, ToolExecutor, ToolOutcome, ToolRegistry
from tests.conftest import Script, sample_registry

API = pytest.mark.parametrize("api", ["chat", "responses"])
STREAM = pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
CALLER = Caller(trajectory_id="t-1", request_id="r-1")
Run = Callable[..., Awaitable[tuple[list[Event], ScriptedModel]]]


async def plan_for(api: str, stream: bool, registry: ToolRegistry, held: MemoryState, **extra: Any) -> Plan:
    if api == "chat":
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream, **extra}
        return await CHAT.plan(body, CALLER, registry, held)
    return await RESPONSES.plan({"model": "m", "input": "hi", "stream": stream, **extra}, CALLER, registry, held)


Build = Callable[..., Awaitable[tuple[Engine, ScriptedModel, MemoryState]]]


@pytest.fixture
async def build(aiohttp_server: AiohttpServer) -> AsyncIterator[Build]:
    """An engine whose upstream is a scripted model answering `replies` in turn."""
    upstreams: list[Upstream] = []
    async with aiohttp.ClientSession() as session:
        async def go(*replies: Reply, registry: ToolRegistry | None = None, keepalive: float = 5.0,
                     max_rounds: int = 10) -> tuple[Engine, ScriptedModel, MemoryState]:
            model = ScriptedModel(Script().then(*replies))
            server = await aiohttp_server(model.app())
            held = MemoryState(10, 60)
            upstreams.append(Upstream(session, str(server.make_url("/v1")), None, 10, 5))
            engine = Engine(Upstreams.one(upstreams[-1]), ToolExecutor(registry or sample_registry()), held,
                            NoInstrumentation(), max_rounds, keepalive)
            return engine, model, held

        yield go
        for upstream in upstreams:
            await upstream.aclose()


@pytest.fixture
def run(build: Build) -> Run:
    """Runs one plan through such an engine; returns its events and the scripted model."""
    async def go(api: str, stream: bool, *replies: Reply, registry: ToolRegistry | None = None,
                 **options: Any) -> tuple[list[Event], ScriptedModel]:
        tools = registry or sample_registry()
        engine, model, held = await build(*replies, registry=tools, **options)
        return [e async for e in engine.run(await plan_for(api, stream, tools, held), CALLER)], model

    return go


@API
@STREAM
async def test_one_gateway_round_then_the_answer(run: Run, api: str, stream: bool) -> None:
    events, model = await run(api, stream, Reply(tool_calls=[("add", {"a": 1, "b": 2})]), Reply(content="three"))
    *pieces, finished = events
    assert isinstance(finished, Finished)
    assert (finished.rounds, finished.client_calls, finished.limit_reached) == (2, (), False)
    assert len(model.requests) == 2
    [(round_, call, outcome)] = finished.tool_runs  # the gateway's call, in the round it came in
    assert (round_, call.name, json.loads(call.arguments), outcome.status, outcome.content) == \
        (0, "add", {"a": 1, "b": 2}, "ok", "3")
    assert call.id == outcome.call_id == finished.turns[0].calls[0].id
    if not stream:
        assert pieces == []  # an answer not streamed shows the calls from tool_runs alone
        return
    opened, *pieces = pieces
    assert isinstance(opened, Opened)  # the first provider stream's headers, before anything else
    kinds = [type(p).__name__ if not isinstance(p, Visible) else f"Visible{p.round}" for p in pieces]
    # the first round's pieces, then its call as it starts and once it ran, then the answer as it came
    started, ran = kinds.index("ToolsStarted"), kinds.index("ToolsRan")
    assert set(kinds[:started]) <= {"Visible0"}
    assert started + 1 == ran
    assert set(kinds[ran + 1:]) == {"Visible1"}
    begun, done = pieces[started], pieces[ran]
    assert isinstance(begun, ToolsStarted)
    assert isinstance(done, ToolsRan)
    assert (begun.round, begun.calls, begun.turn) == (0, (call,), finished.turns[0])
    assert (done.round, done.calls, done.outcomes, done.turn) == (0, (call,), (outcome,), finished.turns[0])


@API
async def test_keepalive_while_a_streamed_round_waits_for_tools(build: Build, api: str) -> None:
    release = asyncio.Event()

    async def slow(args: dict[str, Any]) -> str:
        await release.wait()
        return "done"

    registry = ToolRegistry([Tool(name="slow", function=slow)])
    engine, _, held = await build(Reply(tool_calls=[("slow", {})]), Reply(content="ok"), registry=registry,
                                  keepalive=0.001)
    events: list[Event] = []
    async for event in engine.run(await plan_for(api, True, registry, held), CALLER):
        events.append(event)
        if isinstance(event, Keepalive):
            release.set()  # the tool was still running when this came: now let it finish
    assert release.is_set()
    assert isinstance(events[-1], Finished)
    assert events[-1].rounds == 2
    # the call's start before the keepalives of its wait, its end after them
    kinds = [type(e).__name__ for e in events if isinstance(e, (ToolsStarted, Keepalive, ToolsRan))]
    assert kinds[0] == "ToolsStarted"
    assert kinds[-1] == "ToolsRan"
    assert set(kinds[1:-1]) == {"Keepalive"}
    [ran] = [e for e in events if isinstance(e, ToolsRan)]
    assert [(o.tool_name, o.content) for o in ran.outcomes] == [("slow", "done")]


@API
@STREAM
async def test_the_round_limit_ends_the_run(run: Run, api: str, stream: bool) -> None:
    events, model = await run(api, stream, Reply(tool_calls=[("add", {"a": 1, "b": 2})]),
                              Reply(tool_calls=[("add", {"a": 1, "b": 2})]), max_rounds=1)
    finished = events[-1]
    assert isinstance(finished, Finished)
    assert (finished.rounds, finished.limit_reached, finished.finish_reason) == (2, True, "stop")
    assert model.requests[-1]["tool_choice"] == "none"


@API
async def test_closing_a_streamed_run_closes_the_provider_call(build: Build, api: str) -> None:
    """A consumer that stops reading (the client left) closes the run: the provider connection
    goes with it, while the provider is still mid-answer."""
    engine, model, held = await build(Reply(content="a long answer that stalls", pause_after=4))
    events = engine.run(await plan_for(api, True, sample_registry(), held), CALLER)
    assert isinstance(await anext(events), Opened)
    first = await anext(events)
    assert isinstance(first, Visible)
    await asyncio.wait_for(model.paused.wait(), 10)
    await events.aclose()
    await asyncio.wait_for(model.dropped.wait(), 10)


async def test_a_replay_names_the_calls_it_resumes_after(build: Build) -> None:
    """A request replayed after gateway tools ran resumes after them: its answer still names those
    calls, in the round they came in, with the outcomes the failed run had."""
    engine, model, held = await build(Reply(content="three"))
    plan = await plan_for("responses", False, sample_registry(), held)
    call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "add", "arguments": '{"a":1,"b":2}'}
    first = read_response({"id": "resp_1", "object": "response", "status": "completed", "output": [call]})
    failed = Replays(held, CALLER.principal, plan)
    failed.done(first, [ToolOutcome("call_1", "add", "ok", "3")], [])
    assert await failed.keep()
    *_, finished = [e async for e in engine.run(plan, CALLER)]
    assert isinstance(finished, Finished)
    assert (finished.rounds, len(model.requests)) == (2, 1)  # only the round after the tool's
    [(round_, ran, outcome)] = finished.tool_runs
    assert (round_, ran.id, ran.name, outcome.call_id, outcome.status, outcome.content) == \
        (0, "call_1", "add", "call_1", "ok", "3")
