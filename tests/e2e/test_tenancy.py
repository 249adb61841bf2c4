"""Tenancy, tried as another tenant would: with two gateway keys, one key never reads, continues or
deletes the other's responses, never lands in its trajectories, never pushes its held turns out, and
cannot tell the other's objects from ones that do not exist. Through the real HTTP surface and the
official `openai` client; the response owners across two replicas in a real Redis."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import openai
import pytest
from redis.asyncio import Redis

from gateway.demo.model import Reply
from gateway.http.keys import APPROVALS
from gateway.settings.model import Settings
from gateway.tools import Param, Tool, ToolRegistry
from telemetry import names
from telemetry.store.records import stored_id
from tests.conftest import (
    TEST_KEY,
    USER,
    GatewayFactory,
    Stack,
    StackFactory,
    decide,
    pending,
    server_span,
    toolspan_cli,
)
from tests.e2e.redis_server import RedisServer

BOB_KEY = "sk-bob-key-0000"
NARROW_KEY = "sk-narrow-key-0000"
KEYS = {"alice": {"key": TEST_KEY}, "bob": {"key": BOB_KEY},
        "narrow": {"key": NARROW_KEY, "tools": ["read_file"]}}  # alice's client is the stack's own
REDIS_DB = 6  # a database of these tests' own on the session's redis-server
ASK = {"type": "function", "function": {"name": "ask_human", "description": "Ask the user",
                                        "parameters": {"type": "object", "properties": {}}}}


@asynccontextmanager
async def client_of(stack: Stack, key: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0, timeout=20) as client:
        yield client


@pytest.fixture
async def keyed(make_stack: StackFactory) -> Stack:
    return await make_stack(keys=KEYS)


async def alices_response(stack: Stack, stream: bool = False) -> str:
    stack.script.then(Reply(content="alice's secret plan"))
    return (await stack.respond(stream, input="my secret prompt")).id


# --- provider response ids ----------------------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("other", [BOB_KEY, NARROW_KEY], ids=["another-key", "a-restricted-key"])
async def test_another_key_cannot_reach_a_provider_response(keyed: Stack, stream: bool, other: str) -> None:
    response_id = await alices_response(keyed, stream)
    assert response_id.startswith("resp_scripted_")  # the provider's own id: no gateway round
    seen = len(keyed.model.request_paths)
    async with client_of(keyed, other) as intruder:
        with pytest.raises(openai.NotFoundError):
            await intruder.responses.retrieve(response_id)
        with pytest.raises(openai.NotFoundError):
            await intruder.responses.input_items.list(response_id)
        with pytest.raises(openai.NotFoundError):
            await intruder.responses.cancel(response_id)
        with pytest.raises(openai.NotFoundError):
            await intruder.responses.delete(response_id)
        with pytest.raises(openai.NotFoundError) as continued:
            await intruder.responses.create(model="m", input="and now?", previous_response_id=response_id)
    assert continued.value.body["param"] == "previous_response_id"  # type: ignore[index]
    assert keyed.model.request_paths[seen:] == []  # the provider was never asked: nothing to read or destroy
    # Its owner still has it all.
    raw = await keyed.client.responses.with_raw_response.retrieve(response_id)
    assert raw.headers["x-echo-path"] == f"/v1/responses/{response_id}"
    keyed.script.then(Reply(content="go on"))
    assert (await keyed.respond(False, input="and now?", previous_response_id=response_id)).text == "go on"


async def test_another_keys_response_looks_like_one_that_does_not_exist(keyed: Stack) -> None:
    """A 404 that says nothing a made-up id would not: never a 403 that confirms the id."""
    response_id = await alices_response(keyed)
    made_up = "resp_scripted_" + "9" * len(response_id.removeprefix("resp_scripted_"))
    bodies = []
    for target in (response_id, made_up):
        async with keyed.http.get(f"/v1/responses/{target}", headers={"Authorization": f"Bearer {BOB_KEY}"}) as got:
            assert got.status == 404
            bodies.append(json.dumps(await got.json()).replace(target, "ID"))
    assert bodies[0] == bodies[1]


async def test_the_routes_below_responses_that_name_no_response_pass_on(keyed: Stack) -> None:
    async with keyed.http.post("/v1/responses/input_tokens", json={"model": "m", "input": "x"},
                               headers={"Authorization": f"Bearer {BOB_KEY}"}) as counted:
        assert counted.status == 200
        assert counted.headers["X-Echo-Path"] == "/v1/responses/input_tokens"


async def test_a_gateway_response_id_is_its_keys_alone(keyed: Stack) -> None:
    """An answer over two provider responses goes by a resp_tspan_ id: another key continuing
    from it learns nothing the gateway would not tell of a forgotten one."""
    keyed.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 2})]), Reply(content="3"))
    answer = await keyed.respond(False, input="add", store=True)
    assert answer.id.startswith("resp_tspan_")
    keyed.script.then(Reply(content="from scratch"))
    async with client_of(keyed, BOB_KEY) as bob:
        continued = await bob.responses.create(model="m", input="more", previous_response_id=answer.id)
        with pytest.raises(openai.NotFoundError):
            await bob.responses.retrieve(answer.id)
    assert continued.output_text == "from scratch"
    assert "previous_response_id" not in keyed.upstream_requests[-1]  # nothing of alice's conversation
    for provider_id in ("resp_scripted_1", "resp_scripted_2"):  # the rounds behind it are alice's too
        async with client_of(keyed, BOB_KEY) as bob:
            with pytest.raises(openai.NotFoundError):
                await bob.responses.retrieve(provider_id)


async def test_without_keys_responses_pass_through_as_before(stack: Stack) -> None:
    response_id = await alices_response(stack)
    raw = await stack.client.responses.with_raw_response.retrieve(response_id)
    assert raw.headers["x-echo-path"] == f"/v1/responses/{response_id}"
    raw = await stack.client.responses.with_raw_response.retrieve("resp_never_made")
    assert raw.headers["x-echo-path"] == "/v1/responses/resp_never_made"  # the provider's to answer


async def test_response_owners_hold_across_replicas_in_redis(make_stack: StackFactory, make_gateway: GatewayFactory,
                                                             tmp_path: Path, redis_up: RedisServer) -> None:
    first = await make_stack(keys=KEYS, state_url=redis_up.url)
    settings = Settings(port=0, upstream=f"{first.model.base_url}/v1", state_url=redis_up.url, keys=KEYS,
                        trajectory_store_path=tmp_path / "second.sqlite3")
    second = await make_gateway(settings, provider_name="toolspan.scripted")
    response_id = await alices_response(first, stream=True)
    async with openai.AsyncOpenAI(base_url=f"{second.url}/v1", api_key=BOB_KEY, max_retries=0) as bob:
        with pytest.raises(openai.NotFoundError):
            await bob.responses.retrieve(response_id)
        with pytest.raises(openai.NotFoundError):
            await bob.responses.delete(response_id)
    raw = await second.client.responses.with_raw_response.retrieve(response_id)  # alice, on the other replica
    assert raw.headers["x-echo-path"] == f"/v1/responses/{response_id}"


# --- trajectories -------------------------------------------------------------------------------------

async def test_one_trajectory_id_from_two_keys_is_two_trajectories(keyed: Stack) -> None:
    shared = {"X-Trajectory-Id": "run-42"}
    keyed.script.then(Reply(tool_calls=[("read_file", {"file_path": "/a"})]), Reply(content="alice done"))
    alice = await keyed.ask(False, messages=USER, extra_headers=shared)
    # bob sends the very call alice's model got wrong: in his trajectory it is no retry of hers.
    keyed.script.then(Reply(tool_calls=[("read_file", {"file_path": "/a"})]), Reply(content="bob done"))
    async with client_of(keyed, BOB_KEY) as bob:
        raw = await bob.chat.completions.with_raw_response.create(model="m", messages=USER, extra_headers=shared)
    await keyed.store.flushed()
    assert server_span(keyed, alice.headers["x-trace-id"]).attributes[names.ATTR_KEY_NAME] == "alice"  # type: ignore[index]
    bobs_calls = [s for s in keyed.spans(raw.headers["x-trace-id"]) if s.name == names.SPAN_TOOL_CALL]
    assert [(s.attributes or {}).get(names.ATTR_KEY_NAME) for s in bobs_calls] == ["bob"]
    assert names.ATTR_RETRY_KIND not in (bobs_calls[0].attributes or {})
    reader = keyed.observability.trajectory_reader()
    assert reader is not None
    listed = reader.list_trajectories(tool=None, outcome=None, since=None, model=None, limit=10, key=None)
    assert {(t["key"], t["local_id"], t["requests"]) for t in listed} == {("alice", "run-42", 1), ("bob", "run-42", 1)}
    assert [t["id"] for t in reader.list_trajectories(tool=None, outcome=None, since=None, model=None, limit=10,
                                                      key="bob")] == [stored_id("bob", "run-42")]
    assert reader.trajectory("run-42", "bob")["key"] == "bob"  # type: ignore[index]
    assert reader.trajectory(stored_id("alice", "run-42"), "bob") is None
    assert reader.report("bob")["tool_calls"] == 1


async def test_the_cli_shows_whose_trajectory_it_is(keyed: Stack) -> None:
    keyed.script.then(Reply(content="hi"))
    await keyed.ask(False, messages=USER, extra_headers={"X-Trajectory-Id": "run-7"})
    await keyed.store.flushed()
    listed = await toolspan_cli("trajectories", "list", "--db", str(keyed.store.path))
    assert "alice" in listed.splitlines()[1]
    assert "run-7" in listed
    assert "gateway key alice" in await toolspan_cli("trajectories", "show", "--db", str(keyed.store.path), "--key",
                                                 "alice", "run-7")
    assert "gateway key alice" in await toolspan_cli("trajectories", "show", "--db", str(keyed.store.path),
                                                 stored_id("alice", "run-7"))
    assert "run-7" not in await toolspan_cli("trajectories", "list", "--db", str(keyed.store.path), "--key", "bob")


# --- held turns ---------------------------------------------------------------------------------------

async def mixed_turn(stack: Stack, client: openai.AsyncOpenAI) -> list[dict[str, Any]]:
    """A turn calling the gateway's read_file and the client's ask_human; the conversation its
    client sends back."""
    stack.script.then(Reply(tool_calls=[("read_file", {"path": "/a"}), ("ask_human", {})]))
    answer = await client.chat.completions.create(model="m", messages=USER, tools=[ASK])  # type: ignore[list-item]
    calls = [c.model_dump() for c in answer.choices[0].message.tool_calls or []]
    return [*USER, {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": calls[0]["id"], "content": "yes"}]


async def test_one_key_cannot_push_another_keys_held_turns_out(make_stack: StackFactory) -> None:
    """The default share per key (pending_turn_capacity_per_key, 250) below the capacity: a key
    holding more than its share loses its own oldest, never another key's."""
    stack = await make_stack(keys=KEYS, pending_turn_capacity=260)
    async with client_of(stack, BOB_KEY) as bob:
        bobs = await mixed_turn(stack, bob)
        alices = [await mixed_turn(stack, stack.client) for _ in range(260)]
        stack.script.then(Reply(content="bob carries on"))
        answer = await bob.chat.completions.create(model="m", messages=bobs, tools=[ASK])  # type: ignore[arg-type]
    assert answer.choices[0].message.content == "bob carries on"
    assert stack.metric(names.METRIC_HELD_TURNS_LOST, route="/v1/chat/completions") == 0
    stack.script.then(Reply(content="alice's oldest goes on without it"))
    await stack.client.chat.completions.create(model="m", messages=alices[0], tools=[ASK])  # type: ignore[arg-type]
    assert stack.metric(names.METRIC_HELD_TURNS_LOST, route="/v1/chat/completions") == 1  # alice's own oldest went
    stack.script.then(Reply(content="alice carries on"))
    latest = await stack.client.chat.completions.create(model="m", messages=alices[-1], tools=[ASK])  # type: ignore[arg-type]
    assert latest.choices[0].message.content == "alice carries on"


@pytest.fixture(params=["memory", "redis"])
async def state_url(request: pytest.FixtureRequest, redis_up: RedisServer) -> AsyncIterator[str | None]:
    """None (the store in memory), or a database of these tests' own on the session's redis-server,
    emptied around each test."""
    if request.param == "memory":
        yield None
        return
    url = f"{redis_up.url.rsplit('/', 1)[0]}/{REDIS_DB}"
    client = Redis.from_url(url)
    await client.flushdb()
    try:
        yield url
    finally:
        await client.flushdb()
        await client.aclose()


async def test_a_key_within_its_fair_share_keeps_its_held_turn_when_the_store_fills(
        make_stack: StackFactory, state_url: str | None) -> None:
    """Issue 53, item 13: the capacity (20) below the per-key bound (its default, 250), so only the
    capacity bounds bob. His 25 mixed turns fill the store past it: what goes is his own oldest,
    never alice's one held turn, in memory and in Redis alike."""
    stack = await make_stack(keys=KEYS, pending_turn_capacity=20, state_url=state_url)
    alices = await mixed_turn(stack, stack.client)
    async with client_of(stack, BOB_KEY) as bob:
        bobs = [await mixed_turn(stack, bob) for _ in range(25)]
        stack.script.then(Reply(content="bob's oldest goes on without it"))
        await bob.chat.completions.create(model="m", messages=bobs[0], tools=[ASK])  # type: ignore[arg-type]
    assert stack.metric(names.METRIC_HELD_TURNS_LOST, route="/v1/chat/completions") == 1  # his own went

    def saw_her_result(body: dict[str, Any]) -> Reply:
        results = [m["content"] for m in body["messages"] if m.get("role") == "tool"]
        return Reply(content="alice carries on" if results == ["contents of /a", "yes"] else f"lost: {results}")

    stack.script.then(saw_her_result)
    answer = await stack.client.chat.completions.create(model="m", messages=alices, tools=[ASK])  # type: ignore[arg-type]
    assert answer.choices[0].message.content == "alice carries on"
    assert stack.metric(names.METRIC_HELD_TURNS_LOST, route="/v1/chat/completions") == 1  # not risen by hers


# --- pending approvals --------------------------------------------------------------------------------

PAY = Tool(name="pay", description="Pay someone", function=lambda args: f"paid {args['amount']}", approval=True,
           concurrent=True, parameters=[Param("amount", "number", required=True)])


async def test_a_key_asking_for_every_approval_leaves_room_for_another(make_stack: StackFactory,
                                                                        state_url: str | None) -> None:
    """Issue 53, item 3: bob asks for as many approvals at once as the gateway holds in all (1,000,
    its default): he holds his share (approvals_max_pending_per_key, 250), the rest of his calls
    hear at once that no approval could be asked, and alice's call waits for its reviewer rather
    than being refused; in memory and in Redis alike."""
    keys = {"alice": {"key": TEST_KEY, "approver": True}, "bob": {"key": BOB_KEY}}
    stack = await make_stack(registry=ToolRegistry([PAY]), keys=keys, state_url=state_url)
    approvals = stack.http.server.app[APPROVALS]

    def decided(decision: str) -> float:
        return stack.metric(names.METRIC_APPROVAL_DECISIONS, tool="pay", decision=decision)

    async def settled(done: Callable[[], bool]) -> None:
        async with asyncio.timeout(20):
            while not done():
                await approvals.next_change().wait()

    stack.script.then(Reply(tool_calls=[("pay", {"amount": n}) for n in range(1000)]))
    async with client_of(stack, BOB_KEY) as bob:
        bobs = asyncio.ensure_future(bob.chat.completions.create(model="m", messages=USER))  # type: ignore[arg-type]
        try:
            await settled(lambda: stack.metric(names.METRIC_APPROVALS_PENDING) + decided("unavailable") == 1000)
            assert stack.metric(names.METRIC_APPROVALS_PENDING) == 250
            stack.script.then(Reply(tool_calls=[("pay", {"amount": 7})]), Reply(content="alice paid"))
            alices = asyncio.ensure_future(stack.client.chat.completions.create(model="m", messages=USER))  # type: ignore[arg-type]
            await settled(lambda: stack.metric(names.METRIC_APPROVALS_PENDING) == 251 or alices.done())
            [mine] = await pending(stack)  # alice sees her own only
            assert (mine["arguments"], mine["status"]) == ({"amount": 7}, "pending")
            assert await decide(stack, mine["id"], decision="approve") == (200, {**mine, "status": "approved"})
            assert (await alices).choices[0].message.content == "alice paid"
            assert decided("unavailable") == 750  # bob's, none of alice's
        finally:
            bobs.cancel()
            await asyncio.gather(bobs, return_exceptions=True)
    await settled(lambda: stack.metric(names.METRIC_APPROVALS_PENDING) == 0)


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1//responses/{id}"), ("DELETE", "/v1//responses/{id}"),
                                              ("GET", "/v1//responses/{id}/input_items"),
                                              ("GET", "/v1/responses//{id}"), ("POST", "/v1//responses"),
                                              ("POST", "/v1//chat/completions")])
async def test_a_doubled_slash_reaches_nothing(keyed: Stack, method: str, path: str) -> None:
    """The provider reads /v1//responses/ID as /responses/ID: a path the gateway checked as another."""
    response_id = await alices_response(keyed)
    seen = len(keyed.model.request_paths)
    async with keyed.http.request(method, path.format(id=response_id), headers={"Authorization": f"Bearer {BOB_KEY}"},
                                  json={"model": "m", "input": "go on", "previous_response_id": response_id,
                                        "messages": USER}) as answer:
        assert answer.status == 404
        assert (await answer.json())["error"]["code"] == "invalid_path"
    assert keyed.model.request_paths[seen:] == []


async def test_a_stream_that_names_its_response_only_at_the_end_is_claimed(keyed: Stack) -> None:
    completed = {"type": "response.completed", "sequence_number": 0, "response": {
        "id": "resp_late_1", "object": "response", "created_at": 0, "status": "completed", "model": "m",
        "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": "late", "annotations": []}]}],
        "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}}
    keyed.script.then(Reply(raw_stream=b"event: response.completed\ndata: " + json.dumps(completed).encode() + b"\n\n"))
    assert (await keyed.respond(True, input="hi")).id == "resp_late_1"
    raw = await keyed.client.responses.with_raw_response.retrieve("resp_late_1")
    assert raw.headers["x-echo-path"] == "/v1/responses/resp_late_1"  # its own key's
    async with client_of(keyed, BOB_KEY) as bob:
        with pytest.raises(openai.NotFoundError):
            await bob.responses.retrieve("resp_late_1")


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/echo"], ids=["tool-loop", "pass-through"])
async def test_query_string_credentials_stay_with_the_caller(keyed: Stack, route: str) -> None:
    """With keys the provider is called with the gateway's key: a caller's ?key= or ?api_key=
    (Gemini-style) is its own, and stays here; other parameters go on."""
    keyed.script.then(Reply(content="hi"))
    query = "?key=caller-secret-1&api_key=caller-secret-2&x_token=caller-secret-3&api-version=2024-10-21"
    async with keyed.http.post(route + query, json={
            "model": "m", "messages": USER}, headers={"Authorization": f"Bearer {TEST_KEY}"}) as answer:
        assert answer.status == 200
        forwarded = answer.headers.get("X-Echo-Path") or keyed.model.request_paths[-1]
    assert "caller-secret" not in forwarded
    assert forwarded.endswith("?api-version=2024-10-21")


async def test_with_keys_a_request_cannot_name_a_conversation(keyed: Stack) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        await keyed.client.responses.create(model="m", input="hi", conversation="conv_someone_elses")
    assert refused.value.code == "conversation_not_supported"
    assert keyed.upstream_requests == []
