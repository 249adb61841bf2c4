"""Property: for any interleaving of two keys' requests (create a response, streamed or not; continue,
retrieve, delete and list the input of one, their own or the other's; hold a mixed turn and follow
it up; run a tool call in a trajectory id both keys send), nothing alice does changes or reveals
what bob sees. Bob's run is played twice on fresh gateways: among alice's requests, and alone with
each of alice's objects replaced by one that does not exist. Everything bob gets back (statuses,
answers, which of the ids he knows each names) and everything his page would show (his
trajectories and report) must be the same both times."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.app import create_app
from gateway.demo.model import Reply, ScriptedModel
from gateway.runtime.process import build_telemetry
from gateway.settings.model import Settings
from telemetry.store.reader import StoreReader
from tests.conftest import sample_registry

KEYS = {"alice": {"key": "sk-alice-key-0000"}, "bob": {"key": "sk-bob-key-00000"}}
ASK = {"type": "function", "function": {"name": "ask_human", "parameters": {"type": "object", "properties": {}}}}
KINDS = ("create", "create_streamed", "continue", "retrieve", "delete", "input_items", "mixed", "follow", "shared")


@dataclass(frozen=True)
class Op:
    key: str  # "alice" or "bob"
    kind: str
    ref: int  # which known response or held turn it names (its owner's or the other key's)


OPS = st.lists(st.builds(Op, st.sampled_from(("alice", "bob")), st.sampled_from(KINDS), st.integers(0, 7)),
               min_size=1, max_size=14)


def policy(body: dict[str, Any]) -> Reply:
    """The model, the same whoever asks: what it answers depends on the last message alone."""
    last = (body.get("messages") or [{}])[-1]
    if last.get("role") == "tool":
        return Reply(content="after tools")
    if last.get("content") == "mixed":
        return Reply(tool_calls=[("read_file", {"path": "/a"}), ("ask_human", {})])
    if last.get("content") == "shared":
        return Reply(tool_calls=[("read_file", {"file_path": "/a"})])  # rejected: a renamed argument
    return Reply(content="answer")


@dataclass
class World:
    """One run's gateway and what its keys have made, in order: response ids and held conversations
    (None where the other key's were left out of this run: a made-up one stands in)."""

    clients: dict[str, openai.AsyncOpenAI]
    store: Path
    responses: list[str] = field(default_factory=list)
    held: list[list[dict[str, Any]]] = field(default_factory=list)

    def response(self, ref: int) -> str:
        return self.responses[ref % len(self.responses)] if self.responses else "resp_made_up_none"

    def name_of(self, response_id: str) -> int | None:
        """Which of the known responses an id is: ids differ between runs, their places do not."""
        return self.responses.index(response_id) if response_id in self.responses else None


@asynccontextmanager
async def world(tmp: Path) -> AsyncIterator[World]:
    async with AsyncExitStack() as exits:
        model = ScriptedModel(policy, stores_responses=True)
        upstream = TestServer(model.app())
        await upstream.start_server()
        exits.push_async_callback(upstream.close)
        store = tmp / "store.sqlite3"
        gateway_settings = Settings(port=0, upstream=str(upstream.make_url("/v1")), keys=KEYS,
                                    pending_turn_capacity=6, pending_turn_capacity_per_key=3,
                                    trajectory_store_path=store)
        telemetry = build_telemetry(gateway_settings.model_copy(update={"upstream_provider_name": "toolspan.scripted"}))
        assert telemetry.provider is not None
        assert telemetry.store is not None
        exits.callback(telemetry.provider.shutdown)
        app = create_app(gateway_settings, sample_registry(), telemetry.instrumentation, telemetry.state,
                         telemetry.trajectory_reader())
        server = TestServer(app)
        await server.start_server()
        exits.push_async_callback(server.close)
        clients = {}
        for name, spec in KEYS.items():
            clients[name] = await exits.enter_async_context(openai.AsyncOpenAI(
                base_url=str(server.make_url("/v1")), api_key=spec["key"], max_retries=0, timeout=20))
        yield World(clients, store)
        await telemetry.store.flushed()


async def status_of(call: Any) -> tuple[int, str | None]:
    try:
        await call
    except openai.APIStatusError as refused:
        return refused.status_code, refused.code
    return 200, None


async def play(world: World, op: Op) -> tuple[Any, ...]:
    """Runs one request; what its client saw."""
    client = world.clients[op.key]
    if op.kind in ("create", "create_streamed", "continue"):
        previous = world.response(op.ref) if op.kind == "continue" else None
        try:
            if op.kind == "create_streamed":
                async with await client.responses.create(model="m", input="hello", stream=True) as events:
                    answer = [e async for e in events][-1].response  # type: ignore[attr-defined]
            else:
                answer = await client.responses.create(model="m", input="hello", previous_response_id=previous)
        except openai.APIStatusError as refused:
            return op.kind, refused.status_code, refused.code
        if op.kind != "continue":  # (whether a continuation succeeds depends on whose id it names)
            world.responses.append(answer.id)
        return op.kind, 200, answer.output_text, world.name_of(answer.id)
    if op.kind in ("retrieve", "delete", "input_items"):
        target = world.response(op.ref)
        calls = {"retrieve": client.responses.with_raw_response.retrieve,
                 "delete": client.responses.with_raw_response.delete,
                 "input_items": client.responses.input_items.with_raw_response.list}
        return op.kind, await status_of(calls[op.kind](target)), world.name_of(target)
    if op.kind == "mixed":
        answer = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "mixed"}],
                                                      tools=[ASK])  # type: ignore[list-item]
        calls = [c.model_dump() for c in answer.choices[0].message.tool_calls or []]
        world.held.append([{"role": "user", "content": "mixed"}, {"role": "assistant", "tool_calls": calls},
                           {"role": "tool", "tool_call_id": calls[0]["id"], "content": "yes"}])
        return op.kind, [c["function"]["name"] for c in calls]
    if op.kind == "follow":
        if not world.held:
            return (op.kind, None)
        conversation = world.held[op.ref % len(world.held)]
        try:
            followed = await client.chat.completions.create(model="m", messages=conversation,  # type: ignore[arg-type]
                                                            tools=[ASK])  # type: ignore[list-item]
        except openai.APIStatusError as refused:
            return op.kind, refused.status_code
        return op.kind, 200, followed.choices[0].message.content
    answer = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "shared"}],
                                                  extra_headers={"X-Trajectory-Id": "shared-run"})
    return op.kind, answer.choices[0].message.content


def stand_in(world: World, op: Op) -> None:
    """What alice's request leaves in the world when it is left out: an object of the same kind
    that does not exist."""
    if op.kind in ("create", "create_streamed"):
        world.responses.append(f"resp_made_up_{len(world.responses)}")
    elif op.kind == "mixed":
        made_up = {"id": f"tspan_000000000000_call_{len(world.held)}", "type": "function",
                   "function": {"name": "ask_human", "arguments": "{}"}}
        world.held.append([{"role": "user", "content": "mixed"}, {"role": "assistant", "tool_calls": [made_up]},
                           {"role": "tool", "tool_call_id": made_up["id"], "content": "yes"}])


async def bobs_view(ops: list[Op], with_alice: bool, tmp: Path) -> tuple[list[Any], list[Any], dict[str, Any] | None]:
    async with world(tmp) as shared:
        seen = []
        for op in ops:
            if op.key == "bob":
                seen.append(await play(shared, op))
            elif with_alice:
                await play(shared, op)
            else:
                stand_in(shared, op)
    if not shared.store.exists():  # nobody's request was recorded
        return seen, [], None
    reader = StoreReader(shared.store)
    # A trajectory bob did not name has an id of its own, drawn afresh in each run: what it holds counts.
    listed = sorted((t["key"], t["local_id"] if t["local_id"] == "shared-run" else "(fresh)", t["requests"],
                     t["model_turns"], t["tool_calls"], t["failed_calls"], t["retries"], t["stuck"])
                    for t in reader.list_trajectories(tool=None, outcome=None, since=None, model=None, limit=100,
                                                      key="bob"))
    if not listed:
        return seen, [], None
    figures = reader.report("bob")
    return seen, listed, {k: figures[k] for k in ("trajectories", "tool_calls", "model_turns", "overall")}


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
def test_nothing_alice_does_changes_what_bob_sees(tmp_path_factory: Any, ops: list[Op]) -> None:
    with_alice = asyncio.run(bobs_view(ops, True, tmp_path_factory.mktemp("with")))
    alone = asyncio.run(bobs_view(ops, False, tmp_path_factory.mktemp("alone")))
    assert with_alice[0] == alone[0]  # every answer bob got
    assert with_alice[1:] == alone[1:]  # his trajectories and his report
    # ... and his trajectories are his own requests, exactly: the one id both keys send holds his alone.
    shared = sum(op.key == "bob" and op.kind == "shared" for op in ops)
    assert [row[2] for row in with_alice[1] if row[1] == "shared-run"] == ([shared] if shared else [])
