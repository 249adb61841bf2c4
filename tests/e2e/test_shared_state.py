"""Two gateway replicas sharing held turns in a real Redis (Debian's `redis-server`, started here on
a free port): a mixed turn started on one is completed on the other, in both APIs; later requests
of the conversation are restored on either; concurrent follow-ups both get the whole history; and
while Redis is down or stalled, what needs the state gets a 503 with retry-after, the rest works,
/readyz and the metrics say so, and it all works again once Redis is back."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from redis.asyncio import Redis

from gateway.demo.model import Reply
from gateway.http.keys import APPROVALS, REGISTRY
from gateway.settings.model import Settings
from gateway.state import Bounds, FailureBounds, HeldTurn, MemoryState, OwnedMaps, RedisState, StateStore, Table
from gateway.state import store as tables
from gateway.state.approvals import PUSHED_OUT, ApprovalBounds, RedisApprovals
from gateway.state.redis_connection import REDIS_CONNECTIONS
from gateway.state.redis_values import sent_of, trajectory_of
from gateway.tools import Param, Tool
from gateway.tools.approval_gate import Viewer
from gateway.ui.approvals import FORM_COOKIE
from telemetry import names
from tests.conftest import GatewayFactory, Stack, StackFactory, free_port
from tests.e2e.redis_server import RedisServer

ASK = {"name": "ask_human", "description": "Ask the user", "parameters": {"type": "object", "properties": {}}}
CHAT_TOOLS = [{"type": "function", "function": ASK}]
RESPONSES_TOOLS = [{"type": "function", **ASK}]
MESSAGES_TOOLS = [{"name": ASK["name"], "description": ASK["description"], "input_schema": ASK["parameters"]}]
Replicas = Callable[..., Awaitable[tuple["Stack", "Stack"]]]


@pytest.fixture
def replicas(make_stack: StackFactory, make_gateway: GatewayFactory, tmp_path: Path,
             redis_up: RedisServer) -> Replicas:
    """Two gateways on one Redis and one scripted provider."""
    async def build(**overrides: Any) -> tuple[Stack, Stack]:
        first = await make_stack(state_url=redis_up.url, **overrides)
        settings = Settings(port=0, upstream=f"{first.model.base_url}/v1", state_url=redis_up.url,
                            trajectory_store_path=tmp_path / "second.sqlite3", upstream_kind="compatible", **overrides)
        second = await make_gateway(settings, provider_name="toolspan.scripted")
        return first, Stack(second.url, second.http, second.client, first.model, first.script, second.exporter,
                            second.metrics, second.observability, first.upstream_server)
    return build


def saw_the_sum(body: dict[str, Any]) -> Reply:
    """An answer only if the gateway's earlier round is in the model's view (Chat or Responses)."""
    if "messages" in body:
        results = [m["content"] for m in body["messages"] if m.get("role") == "tool"]
    else:
        results = [i["output"] for i in body["input"] if i.get("type") == "function_call_output"]
    assert results[:2] == ["5", "Paris"], results
    return Reply(content="5, in Paris.")


async def chat_mixed_turn(stack: Stack, stream: bool) -> list[dict[str, Any]]:
    """A mixed turn (the gateway's `add`, the client's `ask_human`) on `stack`; the conversation
    the client sends back, with its answer."""
    stack.script.then(Reply(content="Adding. ", tool_calls=[("add", {"a": 2, "b": 3}), ("ask_human", {})]))
    messages: list[dict[str, Any]] = [{"role": "user", "content": "add, then ask me where"}]
    first = await stack.ask(stream, messages=messages, tools=CHAT_TOOLS)
    [call] = first.tool_calls
    assert call["id"].startswith("tspan_")
    return [*messages, {"role": "assistant", "content": first.content, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "Paris"}]


def sent_roles(stack: Stack) -> list[str]:
    return [m["role"] for m in stack.upstream_requests[-1]["messages"]]


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_turn_started_on_one_replica_completes_on_the_other(
        replicas: Replicas, stream: bool) -> None:
    one, other = await replicas()
    messages = await chat_mixed_turn(one, stream)
    one.script.then(saw_the_sum)
    assert (await other.ask(stream, messages=messages, tools=CHAT_TOOLS)).content == "5, in Paris."
    assert sent_roles(other) == ["user", "assistant", "tool", "tool"]
    # A later request of the same conversation is restored on either replica.
    later = [*messages, {"role": "assistant", "content": "5, in Paris."}, {"role": "user", "content": "again?"}]
    for replica in (one, other, one):
        replica.script.then(saw_the_sum)
        assert (await replica.ask(stream, messages=later, tools=CHAT_TOOLS)).content == "5, in Paris."
        assert sent_roles(replica) == ["user", "assistant", "tool", "tool", "assistant", "user"]


@pytest.mark.parametrize("stream", [False, True])
async def test_responses_turn_started_on_one_replica_completes_on_the_other(
        replicas: Replicas, stream: bool) -> None:
    one, other = await replicas()
    one.script.then(Reply(content="Adding.", tool_calls=[("add", {"a": 2, "b": 3})]),
                    Reply(tool_calls=[("ask_human", {})]), saw_the_sum)
    first = await one.respond(stream, input="add, then ask me where", tools=RESPONSES_TOOLS, store=False)
    [call] = first.calls
    assert call["call_id"].startswith("tspan_")
    follow_up = [{"role": "user", "content": "add, then ask me where"}, *first.output,
                 {"type": "function_call_output", "call_id": call["call_id"], "output": "Paris"}]
    second = await other.respond(stream, input=follow_up, tools=RESPONSES_TOOLS, store=False)
    assert second.text == "5, in Paris."
    kinds = [(i.get("type"), i.get("name")) for i in one.upstream_requests[-1]["input"]]
    assert kinds == [(None, None), ("message", None), ("function_call", "add"), ("function_call_output", None),
                     ("function_call", "ask_human"), ("function_call_output", None)]
    later = [*follow_up, *second.output, {"role": "user", "content": "again?"}]
    for replica in (one, other):
        replica.script.then(saw_the_sum)
        assert (await replica.respond(stream, input=later, tools=RESPONSES_TOOLS, store=False)).text == "5, in Paris."
        assert [i.get("name") for i in one.upstream_requests[-1]["input"]][2:5] == ["add", None, "ask_human"]


@pytest.mark.parametrize("stream", [False, True])
async def test_messages_turn_started_on_one_replica_completes_on_the_other(
        replicas: Replicas, stream: bool) -> None:
    one, other = await replicas()
    one.script.then(Reply(content="Adding.", tool_calls=[("add", {"a": 2, "b": 3}), ("ask_human", {})]),
                    saw_the_sum)
    question = [{"role": "user", "content": "add, then ask me where"}]

    async def ask(stack: Stack, messages: list[dict[str, Any]]) -> dict[str, Any]:
        async with stack.anthropic() as client:
            request: Any = {"model": "claude-test", "max_tokens": 64, "messages": messages, "tools": MESSAGES_TOOLS}
            if not stream:
                return (await client.messages.create(**request)).to_dict()
            async with client.messages.stream(**request) as streamed:
                return (await streamed.get_final_message()).to_dict()

    first = await ask(one, question)
    [call] = [block for block in first["content"] if block["type"] == "tool_use"]
    assert call["id"].startswith("tspan_")
    follow_up = [*question, {"role": "assistant", "content": first["content"]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "Paris"}]}]
    second = await ask(other, follow_up)
    assert second["content"][0]["text"] == "5, in Paris."
    restored = one.upstream_requests[-1]["messages"]  # both calls, then both results (the gateway's first)
    assert [b["name"] for b in restored[1]["content"] if b["type"] == "tool_use"] == ["add", "ask_human"]
    assert [b["content"] for b in restored[2]["content"]] == ["5", "Paris"]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_call_waiting_for_approval_on_one_replica_is_decided_on_the_other(
        replicas: Replicas, stream: bool) -> None:
    one, other = await replicas(interrupt_mode="wait", keepalive_seconds=0.05)
    sent: list[dict[str, Any]] = []
    registry_tool = Tool(name="pay", function=lambda args: sent.append(args) or "paid", approval=True,
                         parameters=[Param("amount", "number", required=True)])
    for replica in (one, other):
        replica.http.server.app[REGISTRY].register(registry_tool)
    one.script.then(Reply(tool_calls=[("pay", {"amount": 4})]), Reply(content="Paid 4."))
    asking = asyncio.ensure_future(one.ask(stream, messages=[{"role": "user", "content": "pay 4"}]))
    approvals = other.http.server.app[APPROVALS]
    async with asyncio.timeout(10):  # listed on the other replica, from Redis, once the first asked it
        while True:
            asked = one.http.server.app[APPROVALS].next_change()
            if listed := await approvals.pending(Viewer(None, True, True)):
                break
            await asked.wait()
    assert listed[0]["tool"] == "pay"
    decided = await other.http.post(f"/v1/approvals/{listed[0]['id']}", json={"decision": "approve"})
    assert decided.status == 200
    answer = await asyncio.wait_for(asking, 10)
    assert answer.content == "Paid 4."
    assert sent == [{"amount": 4}]
    assert await approvals.pending(Viewer(None, True, True)) == []


async def test_concurrent_follow_ups_on_two_replicas_both_get_the_whole_history(
        replicas: Replicas) -> None:
    one, other = await replicas()
    messages = await chat_mixed_turn(one, False)
    one.script.then(saw_the_sum, saw_the_sum)
    answers = await asyncio.gather(one.ask(False, messages=messages, tools=CHAT_TOOLS),
                                   other.ask(False, messages=messages, tools=CHAT_TOOLS))
    assert [a.content for a in answers] == ["5, in Paris.", "5, in Paris."]
    assert [[m["role"] for m in r["messages"]] for r in one.upstream_requests[-2:]] == [
        ["user", "assistant", "tool", "tool"]] * 2


async def test_a_responses_answer_id_made_on_one_replica_continues_on_the_other(
        replicas: Replicas) -> None:
    one, other = await replicas()
    one.script.then(Reply(tool_calls=[("add", {"a": 2, "b": 3})]), Reply(content="5"), Reply(content="yes"))
    first = await one.respond(False, input="add", store=True)
    assert first.id.startswith("resp_tspan_")
    second = await other.respond(False, input="sure?", previous_response_id=first.id, store=True)
    assert second.text == "yes"
    assert one.upstream_requests[-1]["previous_response_id"] != first.id  # the provider's last response


def state_unavailable(error: openai.APIStatusError) -> None:
    assert error.status_code == 503
    assert error.response.headers["retry-after"].isdigit()
    assert isinstance(error.body, dict)
    assert error.body["code"] == "state_unavailable"


@pytest.mark.parametrize("stream", [False, True])
async def test_redis_down_then_back(replicas: Replicas, redis_up: RedisServer, stream: bool) -> None:
    one, other = await replicas(state_timeout_seconds=0.5)
    messages = await chat_mixed_turn(one, stream)
    redis_up.stop()
    try:
        with pytest.raises(openai.APIStatusError) as caught:  # needs the held turn: a 503, not a wrong history
            await other.ask(stream, messages=messages, tools=CHAT_TOOLS)
        state_unavailable(caught.value)
        one.script.then(Reply(content="hello"))  # needs no state: works
        assert (await other.ask(stream, messages=[{"role": "user", "content": "hi"}])).content == "hello"
        ready = await other.http.get("/readyz")
        assert (ready.status, await ready.json()) == (200, {"status": "degraded", "state_store": "unavailable"})
        assert other.metric(names.METRIC_STATE_STORE_UP) == 0
        assert other.metric(names.METRIC_STATE_STORE_FAILURES) >= 1
    finally:
        redis_up.start()
    # Back: the client reconnects on its own. The server kept no data, so the turn held before the
    # outage is gone: the follow-up goes on with the client's copy, marked as a turn lost.
    one.script.then(Reply(content="went on"))
    assert (await other.ask(stream, messages=messages, tools=CHAT_TOOLS)).content == "went on"
    assert other.metric(names.METRIC_HELD_TURNS_LOST, route="/v1/chat/completions") == 1
    messages = await chat_mixed_turn(one, stream)
    # The loss is reported: `one` had seen Redis's marker before the outage, and finds it gone.
    assert one.metric(names.METRIC_STATE_STORE_LOSSES) == 1
    one.script.then(saw_the_sum)
    assert (await other.ask(stream, messages=messages, tools=CHAT_TOOLS)).content == "5, in Paris."
    ready = await other.http.get("/readyz")
    assert (ready.status, await ready.json()) == (200, {"status": "ready", "state_store": "up"})
    assert other.metric(names.METRIC_STATE_STORE_UP) == 1


async def test_redis_stalled_is_a_503_within_the_timeout(replicas: Replicas, redis_up: RedisServer) -> None:
    one, other = await replicas(state_timeout_seconds=0.3)
    messages = await chat_mixed_turn(one, False)
    assert redis_up.process is not None
    os.kill(redis_up.process.pid, signal.SIGSTOP)
    try:
        with pytest.raises(openai.APIStatusError) as caught:
            await asyncio.wait_for(other.ask(False, messages=messages, tools=CHAT_TOOLS), 5)
        state_unavailable(caught.value)
    finally:
        os.kill(redis_up.process.pid, signal.SIGCONT)
    one.script.then(saw_the_sum)
    assert (await other.ask(False, messages=messages, tools=CHAT_TOOLS)).content == "5, in Paris."


# --- retry state -------------------------------------------------------------------------------------

USER = [{"role": "user", "content": "read a"}]
TRAJECTORY = {"X-Trajectory-Id": "agent-7"}


def tool_calls(stack: Stack) -> list[Any]:
    return [s for s in stack.spans() if s.name == names.SPAN_TOOL_CALL]


async def test_a_retry_of_a_call_that_failed_on_the_other_replica_is_classified_and_linked(
        replicas: Replicas) -> None:
    one, other = await replicas()
    one.script.then(Reply(tool_calls=[("read_file", {"file_path": "a"})]), Reply(content="hm"),  # rejected, on one
                    Reply(tool_calls=[("read_file", {"file_path": "a"})]), Reply(content="hm"),  # verbatim, other
                    Reply(tool_calls=[("read_file", {"path": "a"})]), Reply(content="read"))  # corrected, on one
    for stack in (one, other, one):
        await stack.ask(False, messages=USER, extra_headers=TRAJECTORY)
    first, third = tool_calls(one)
    [second] = tool_calls(other)
    kinds = [(s.attributes or {}).get(names.ATTR_RETRY_KIND) for s in (first, second, third)]
    assert kinds == [None, "verbatim", "corrected"]
    assert [(link.context.trace_id, link.context.span_id) for link in second.links] == [
        (first.context.trace_id, first.context.span_id)]
    assert [link.context.span_id for link in third.links] == [second.context.span_id]
    assert other.metric(names.METRIC_TOOL_RETRIES, tool="read_file", kind="verbatim") == 1
    assert one.metric(names.METRIC_TOOL_RECOVERIES, tool="read_file", kind="corrected") == 1
    # Repaired: the next failure-free call of that tool is no retry, on either replica.
    one.script.then(Reply(tool_calls=[("read_file", {"path": "a"})]), Reply(content="read"))
    await other.ask(False, messages=USER, extra_headers=TRAJECTORY)
    assert names.ATTR_RETRY_KIND not in (tool_calls(other)[-1].attributes or {})


async def test_a_client_call_handed_over_on_one_replica_has_its_result_seen_on_the_other(replicas: Replicas) -> None:
    """The client's execute step: handed over by one replica, its result brought to the other, which
    reports it once (taken from Redis: a third request resending it reports nothing on either)."""
    one, other = await replicas()
    one.script.then(Reply(tool_calls=[("ask_human", {})]), Reply(content="Thanks."), Reply(content="Again."))
    first = await one.ask(False, messages=USER, tools=CHAT_TOOLS)
    [call] = first.tool_calls
    history = [*USER, {"role": "assistant", "content": None, "tool_calls": first.tool_calls},
               {"role": "tool", "tool_call_id": call["id"], "content": "yes"}]
    second = await other.ask(False, messages=history, tools=CHAT_TOOLS)
    [step] = [s for s in other.spans(second.headers["x-trace-id"]) if s.name == names.SPAN_TOOL_EXECUTE]
    assert (step.attributes or {})[names.ATTR_TOOL_CALL_ID] == call["id"]
    assert (step.attributes or {})[names.ATTR_OUTCOME] == names.OUTCOME_RETURNED
    await one.ask(False, messages=[*history, {"role": "assistant", "content": "Thanks."}, *USER], tools=CHAT_TOOLS)
    assert one.metric(names.METRIC_CLIENT_TOOL_ROUNDTRIP + "_count") == 0
    assert other.metric(names.METRIC_CLIENT_TOOL_ROUNDTRIP + "_count") == 1


async def test_tool_calls_run_while_redis_is_down_and_say_their_retry_state_is_unknown(
        replicas: Replicas, redis_up: RedisServer) -> None:
    one, other = await replicas(state_timeout_seconds=0.5)
    one.script.then(Reply(tool_calls=[("read_file", {"file_path": "a"})]), Reply(content="hm"))
    await one.ask(False, messages=USER, extra_headers=TRAJECTORY)
    redis_up.stop()
    try:
        one.script.then(Reply(tool_calls=[("read_file", {"path": "a"})]), Reply(content="read"))
        answer = await other.ask(False, messages=USER, extra_headers=TRAJECTORY)  # no 503: the tool ran
        assert answer.content == "read"
        [call] = tool_calls(other)
        attributes = call.attributes or {}
        assert attributes[names.ATTR_OUTCOME] == "ok"
        assert attributes[names.ATTR_RETRY_STATE] == "unavailable"
        assert names.ATTR_RETRY_KIND not in attributes
    finally:
        redis_up.start()


# --- the store alone ----------------------------------------------------------------------------------

def turn(n: int) -> HeldTurn:
    return HeldTurn("chat", ({"role": "assistant", "content": str(n)},), (), (f"msg_{n}",))


async def test_redis_approvals_are_bounded_at_once_and_decided_once(redis_up: RedisServer) -> None:
    """Asks at the same moment cannot pass the bound together; the first decision wins."""
    store = RedisState(redis_up.url, 3, 60.0, 1.0, prefix=f"test{free_port()}:")
    approvals = RedisApprovals(store.connection.redis, store.connection.run, f"test{free_port()}:",
                               ApprovalBounds(capacity=2))
    try:
        added = await asyncio.gather(*(approvals.add(f"appr_{n}", "{}", 60.0, None) for n in range(5)))
        assert sorted(added) == [False, False, False, True, True]
        [first, *_] = [i for i, ok in zip(range(5), added, strict=True) if ok]
        assert await approvals.decide(f"appr_{first}", '{"decision": "approve"}') is True
        assert await approvals.decide(f"appr_{first}", '{"decision": "deny"}') is False
        assert await approvals.decision(f"appr_{first}") == '{"decision": "approve"}'
        assert await approvals.decide("appr_never_asked", '{"decision": "deny"}') is False
    finally:
        await store.aclose()


async def test_without_keys_the_page_of_one_replica_decides_on_the_other(replicas: Replicas) -> None:
    """The page's form token comes from the browser's own cookie, which any replica reads back."""
    one, other = await replicas()
    pay = Tool(name="pay", function=lambda args: "paid", approval=True, parameters=[Param("amount", "number")])
    for replica in (one, other):
        replica.http.server.app[REGISTRY].register(pay)
    one.script.then(Reply(tool_calls=[("pay", {"amount": 4})]), Reply(content="Paid 4."))
    first_visit = await other.http.get("/ui/approvals")  # the browser's cookie, set by the page
    cookie = first_visit.cookies[FORM_COOKIE].value
    asking = asyncio.ensure_future(one.ask(False, messages=[{"role": "user", "content": "pay 4"}]))
    try:
        async with asyncio.timeout(10):
            while True:
                asked = one.http.server.app[APPROVALS].next_change()
                page = await other.http.get("/ui/approvals")  # from Redis, on the replica not asking
                text = await page.text()
                if "section class=\"card approval\"" in text:
                    break
                await asked.wait()
        [(approval_id, token)] = re.findall(r'action="/ui/approvals/(appr_[0-9a-f]+)"><input type="hidden" '
                                            r'name="token" value="([0-9a-f]{64})"', text)
        decided = await one.http.post(f"/ui/approvals/{approval_id}", data={"token": token, "decision": "approve"},
                                      headers={"Origin": one.url, "Cookie": f"{FORM_COOKIE}={cookie}"},
                                      allow_redirects=False)
        assert decided.status == 303
        assert (await asyncio.wait_for(asking, 10)).content == "Paid 4."
    finally:
        if not asking.done():
            asking.cancel()
            await asyncio.gather(asking, return_exceptions=True)


async def test_redis_store_is_bounded_expiring_and_bound_to_its_key(redis_up: RedisServer) -> None:
    prefix = f"test{free_port()}:"
    store = RedisState(redis_up.url, 3, 60.0, 1.0, prefix=prefix)
    try:
        tokens = [await store.hold(turn(n), "alice") for n in range(4)]
        found = await store.lookup("alice", tokens, ["msg_3"])
        assert sorted(found.turns) == sorted(tokens[1:])  # the least recently used went
        assert found.owners == {"msg_3": tokens[3]}
        assert (await store.lookup("bob", tokens, ["msg_3"])).turns == {}  # another key's
        assert (await store.lookup(None, tokens)).turns == {}
        client = Redis.from_url(redis_up.url)
        keys = [k async for k in client.scan_iter(f"{prefix}turn:*")]
        assert len(keys) == 3
        assert all(0 < ttl <= 60_000 for ttl in [await client.pttl(k) for k in keys])
        await client.aclose()
        await store.aliases.put("alice", {"resp_tspan_1": "resp_9"})
        assert (await store.lookup("alice", (), (), "resp_tspan_1")).resolve("resp_tspan_1") == "resp_9"
    finally:
        await store.aclose()


async def test_redis_failure_records_are_bounded_expiring_and_bound_to_their_key(redis_up: RedisServer) -> None:
    prefix = f"test{free_port()}:"
    bounds = FailureBounds(trajectories=2, ttl_seconds=30, tools_per_trajectory=2)
    store = RedisState(redis_up.url, 3, 60.0, 1.0, prefix=prefix, failure_bounds=bounds)
    book = store.failures
    client = Redis.from_url(redis_up.url)
    try:
        for n in range(3):  # three tools in one trajectory: the oldest goes
            await book.remember_failure("alice", "tr-0", f"tool_{n}", f"record {n}")
        assert [await book.failure("alice", "tr-0", f"tool_{n}") for n in range(3)] == [None, "record 1", "record 2"]
        assert await book.failure("bob", "tr-0", "tool_2") is None  # another key's
        await book.remember_failure("alice", "tr-0", "tool_2", None)  # repaired
        assert await book.failure("alice", "tr-0", "tool_2") is None
        for n in range(1, 3):  # three trajectories: the least recently written goes
            await book.remember_failure("alice", f"tr-{n}", "tool_0", "record")
        assert await book.failure("alice", "tr-0", "tool_1") is None
        assert await book.failure("alice", "tr-2", "tool_0") == "record"
        keys = [k async for k in client.scan_iter(f"{prefix}fail:*")]
        assert len(keys) == 2
        assert all(0 < ttl <= 30_000 for ttl in [await client.pttl(k) for k in keys])
    finally:
        await client.aclose()
        await store.aclose()


async def test_a_redis_that_lost_its_data_is_reported(redis_up: RedisServer) -> None:
    prefix = f"test{free_port()}:"
    losses: list[None] = []
    store = RedisState(redis_up.url, 3, 60.0, 1.0, prefix=prefix, lost=lambda: losses.append(None))
    client = Redis.from_url(redis_up.url)
    try:
        token = await store.hold(turn(1), "alice")
        assert await store.status() == "up"
        assert losses == []
        await client.delete(*[k async for k in client.scan_iter(f"{prefix}*")])  # what FLUSHALL or a restart does
        assert (await store.lookup("alice", [token])).turns == {}
        assert len(losses) == 1
        await store.hold(turn(2), "alice")  # a new marker: no second report
        assert await store.status() == "up"
        assert len(losses) == 1
    finally:
        await client.aclose()
        await store.aclose()


def test_settings_name_the_redis_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLSPAN_STATE_URL", "redis://cache:6379/0")
    assert Settings(upstream="http://x").state_url == "redis://cache:6379/0"


async def test_redis_store_bounds_each_keys_share(redis_up: RedisServer) -> None:
    """One key past its share loses its own least recently used, never another key's; past the
    capacity the least recently used of all go, out of their key's set too."""
    prefix = f"test{free_port()}:"
    store = RedisState(redis_up.url, 4, 60.0, 1.0, prefix=prefix, per_key=2)
    client = Redis.from_url(redis_up.url)
    try:
        bobs = await store.hold(turn(0), "bob")
        alices = [await store.hold(turn(n), "alice") for n in range(1, 4)]
        assert sorted((await store.lookup("alice", alices)).turns) == sorted(alices[1:])
        assert list((await store.lookup("bob", [bobs])).turns) == [bobs]
        carols = [await store.hold(turn(n), "carol") for n in range(4, 6)]  # five held: the oldest of all goes
        left = (await store.lookup("alice", alices)).turns.keys()  # one of her two (which: the lookup's order)
        assert len(left) == 1
        assert left <= set(alices[1:])
        assert list((await store.lookup("bob", [bobs])).turns) == [bobs]  # refreshed by the lookup before
        assert sorted((await store.lookup("carol", carols)).turns) == sorted(carols)
        assert await client.zcard(f"{prefix}lru:turn") == 4
        per_key = [k async for k in client.scan_iter(f"{prefix}lru:turn:*")]
        assert sorted([await client.zcard(k) for k in per_key]) == [1, 1, 2]  # alice's set lost her oldest too
        await store.owners.put("alice", {"resp_1": True})
        assert (await store.lookup("alice", (), (), "resp_1")).owned
        assert not (await store.lookup("bob", (), (), "resp_1")).owned
    finally:
        await client.aclose()
        await store.aclose()


async def test_a_burst_past_the_connections_waits_for_one_rather_than_failing(redis_up: RedisServer) -> None:
    """More commands at once than the pool has connections (REDIS_CONNECTIONS): each waits for a
    free one within its time bound; the store stays up (redis-py's default pool refused them)."""
    observed: list[bool] = []
    store = RedisState(redis_up.url, 3, 60.0, 5.0, observe=observed.append, prefix=f"test{free_port()}:")
    try:
        token = await store.hold(turn(1), "alice")
        found = await asyncio.gather(*(store.lookup("alice", [token]) for _ in range(3 * REDIS_CONNECTIONS)))
        assert all(list(f.turns) == [token] for f in found)
        assert False not in observed
    finally:
        await store.aclose()



async def test_a_cancelled_command_is_cancelled_wherever_it_was(redis_up: RedisServer) -> None:
    """A request cancelled while the store talks to Redis stops there, at whichever step of the
    command the cancellation lands (redis-py 8 answered some of them anyway, and an approval's
    wait then went on to its time limit after its client had left)."""
    store = RedisState(redis_up.url, 3, 60.0, 5.0, prefix=f"test{free_port()}:")
    try:
        token = await store.hold(turn(1), "alice")
        went_on = []
        for steps in range(40):
            async def lookup() -> int:
                await store.lookup("alice", [token])
                task = asyncio.current_task()
                return task.cancelling() if task is not None else 0
            task = asyncio.ensure_future(lookup())
            for _ in range(steps):
                await asyncio.sleep(0)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                if await task:  # it answered though its cancellation had come
                    went_on.append(steps)
        assert went_on == []
    finally:
        await store.aclose()

# --- the owned maps the tables are kept in, in memory and in Redis alike -------------------------------

def as_text(value: str) -> str:
    return value


PAIRS = Table("link", Bounds(2, 60.0), as_text, trajectory_of)  # two entries at most
OTHERS = Table("sent", Bounds(10, 60.0), as_text, sent_of)


@pytest.fixture(params=["memory", "redis"])
async def maps(request: pytest.FixtureRequest, redis_up: RedisServer) -> AsyncIterator[OwnedMaps]:
    store: StateStore = (MemoryState(3, 60.0) if request.param == "memory" else
                         RedisState(redis_up.url, 3, 60.0, 1.0, prefix=f"test{free_port()}:"))
    try:
        yield store.maps
    finally:
        await store.aclose()


async def test_owned_maps_read_take_and_forget_each_keys_own_entries(maps: OwnedMaps) -> None:
    await maps.put("alice", (PAIRS, {"a": "tr-a"}), (OTHERS, {"x": "[1]"}))
    found = await maps.get("alice", (OTHERS, ["x", "y"]), (PAIRS, ["b", "a"]))
    assert (found.of(PAIRS), found.of(OTHERS)) == ({"a": "tr-a"}, {"x": "[1]"})
    assert (await maps.get("bob", (PAIRS, ["a"]))).of(PAIRS) == {}  # another key's
    taken = await maps.take("alice", (PAIRS, ["a"]), (OTHERS, ["x", "y"]))
    assert (taken.of(PAIRS), taken.of(OTHERS)) == ({"a": "tr-a"}, {"x": "[1]"})
    assert (await maps.take("alice", (PAIRS, ["a"]))).of(PAIRS) == {}  # taken once
    await maps.put(None, (PAIRS, {"a": "tr-b", "b": "tr-c"}))
    await maps.delete(None, (PAIRS, ["a"]))
    assert (await maps.get(None, (PAIRS, ["b", "a"]))).of(PAIRS) == {"b": "tr-c"}


async def test_a_touched_entry_is_the_most_recently_used(maps: OwnedMaps) -> None:
    """The table full (2), the least recently used goes: not the one touched since it was written."""
    for entry in ("a", "b"):
        await maps.put("alice", (PAIRS, {entry: f"tr-{entry}"}))
    await maps.touch("alice", (PAIRS, ["a"]))
    await maps.put("alice", (PAIRS, {"c": "tr-c"}))
    assert list((await maps.get("alice", (PAIRS, ["a", "b", "c"]))).of(PAIRS)) == ["a", "c"]


async def test_a_touch_refreshes_the_expiry_in_redis(redis_up: RedisServer) -> None:
    store = RedisState(redis_up.url, 3, 60.0, 1.0, prefix=f"test{free_port()}:")
    client = Redis.from_url(redis_up.url)
    try:
        await store.maps.put("alice", (PAIRS, {"a": "tr-a"}))
        key = store.connection.key(PAIRS.kind, "alice", "a")
        await client.pexpire(key, 1000)
        await store.maps.touch("alice", (PAIRS, ["a"]))
        assert 1000 < await client.pttl(key) <= 60_000
    finally:
        await client.aclose()
        await store.aclose()


# --- fair eviction (issue 53), in memory and in Redis alike ------------------------------------------

SMALL = Bounds(4, 60.0, 250)  # every table: a capacity of 4, each key's share (250) above it


@pytest.fixture(params=["memory", "redis"])
async def small_store(request: pytest.FixtureRequest, redis_up: RedisServer,
                      monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[StateStore]:
    """A store whose every per-key table holds 4 entries in all, and 2 approvals."""
    for table in ("TRAJECTORY_LINKS", "REPLAYS", "SENT_CALLS"):
        monkeypatch.setattr(tables, table, SMALL)
    approvals = ApprovalBounds(capacity=2, per_key=2)
    store: StateStore = (
        MemoryState(SMALL.capacity, SMALL.ttl_seconds, per_key=SMALL.per_key, owned=SMALL, approvals=approvals)
        if request.param == "memory" else
        RedisState(redis_up.url, SMALL.capacity, SMALL.ttl_seconds, 1.0, prefix=f"test{free_port()}:",
                   per_key=SMALL.per_key, owned=SMALL, approvals=approvals))
    try:
        yield store
    finally:
        await store.aclose()


Write = Callable[[StateStore, str, int], Awaitable[str]]  # writes entry n for a key; what names it
Read = Callable[[StateStore, str, str], Awaitable[bool]]  # whether the key still has it


async def write_turn(store: StateStore, principal: str, n: int) -> str:
    return await store.hold(turn(n), principal)


async def read_turn(store: StateStore, principal: str, token: str) -> bool:
    return token in (await store.lookup(principal, [token])).turns


async def write_alias(store: StateStore, principal: str, n: int) -> str:
    await store.aliases.put(principal, {f"resp_tspan_{n}": f"resp_{n}"})
    return f"resp_tspan_{n}"


async def read_alias(store: StateStore, principal: str, client_id: str) -> bool:
    return (await store.lookup(principal, (), (), client_id)).response is not None


async def write_owner(store: StateStore, principal: str, n: int) -> str:
    await store.owners.put(principal, {f"resp_{n}": True})
    return f"resp_{n}"


async def read_owner(store: StateStore, principal: str, response_id: str) -> bool:
    return (await store.lookup(principal, (), (), response_id)).owned


async def write_link(store: StateStore, principal: str, n: int) -> str:
    await store.links.put(principal, {f"call_{n}": f"{n:032x}"})
    return f"call_{n}"


async def read_link(store: StateStore, principal: str, call_id: str) -> bool:
    return bool(await store.links.get(principal, [call_id]))


async def write_answer(store: StateStore, principal: str, n: int) -> str:
    await store.answers.put(principal, {f"resp_tspan_{n}": "{}"})
    return f"resp_tspan_{n}"


async def read_answer(store: StateStore, principal: str, response_id: str) -> bool:
    return bool(await store.answers.get(principal, [response_id]))


async def write_sent(store: StateStore, principal: str, n: int) -> str:
    await store.sent.put(principal, {f"call_{n}": "[]"})
    return f"call_{n}"


async def read_sent(store: StateStore, principal: str, call_id: str) -> bool:
    return bool(await store.sent.take(principal, [call_id]))


async def write_rounds(store: StateStore, principal: str, n: int) -> str:
    await store.replays.put(principal, {f"digest_{n}": "{}"})
    return f"digest_{n}"


async def read_rounds(store: StateStore, principal: str, request_key: str) -> bool:
    return bool(await store.replays.take(principal, [request_key]))


TABLES = {"held turns": (write_turn, read_turn), "response aliases": (write_alias, read_alias),
          "response owners": (write_owner, read_owner), "trajectory links": (write_link, read_link),
          "answer records": (write_answer, read_answer), "sent calls": (write_sent, read_sent),
          "replays": (write_rounds, read_rounds)}


@pytest.mark.parametrize("table", list(TABLES))
async def test_another_keys_writes_never_push_out_a_key_within_its_fair_share(small_store: StateStore,
                                                                               table: str) -> None:
    """The table full (4), the oldest of the key holding the most goes: bob's six writes leave
    alice's one entry and carol's two, and cost bob his own oldest."""
    write, read = TABLES[table]
    alices = await write(small_store, "alice", 0)
    carols = [await write(small_store, "carol", n) for n in (1, 2)]
    bobs = [await write(small_store, "bob", n) for n in range(3, 9)]
    assert await read(small_store, "alice", alices)
    # At bob's second write carol and he held two each: the older of their oldest went (carol's
    # first); at each of his later writes he held the most, and lost his own oldest.
    assert [await read(small_store, "bob", b) for b in bobs] == [False] * 4 + [True] * 2
    assert [await read(small_store, "carol", c) for c in carols] == [False, True]


async def test_a_full_store_pushes_out_the_approval_of_the_key_holding_the_most(small_store: StateStore) -> None:
    """Two approvals at most, two a key: bob holds both; alice's ask pushes out his that ends first
    (which is told so), her second is refused (she would hold the most), as is a third of bob's."""
    approvals = small_store.approvals
    assert [await approvals.add(f"appr_b{n}", "{}", 60.0 + n, "bob") for n in range(3)] == [True, True, False]
    assert await approvals.add("appr_a0", "{}", 60.0, "alice")
    assert await approvals.decision("appr_b0") == PUSHED_OUT
    assert await approvals.get("appr_b0") is None  # no longer pending: no reviewer can decide it
    assert not await approvals.decide("appr_b0", '{"decision": "approve"}')
    assert sorted(i for i, _, _ in await approvals.held()) == ["appr_a0", "appr_b1"]
    assert not await approvals.add("appr_a1", "{}", 60.0, "alice")
    assert not await approvals.add("appr_b3", "{}", 60.0, "bob")
    for approval_id, principal in (("appr_b0", "bob"), ("appr_b1", "bob"), ("appr_a0", "alice")):
        await approvals.remove(approval_id, principal)
    assert await approvals.decision("appr_b0") is None
    assert await approvals.held() == []
