"""One agent run is one trajectory, though no client library sends X-Trajectory-Id: a request
joins the trajectory of the calls whose results it carries, of the response it continues, or of
its client's session header, each per gateway key; its span says how (toolspan.trajectory.source).
And a request sending `tools: []` on purpose gets no gateway tools."""

from __future__ import annotations

from typing import Any

import pytest
from agents import Agent, Runner
from openai import AsyncOpenAI

from gateway.demo.model import Reply
from telemetry import names
from tests.conftest import AUTH, USER, Stack, StackFactory
from tests.e2e.redis_server import RedisServer
from tests.e2e.test_agents_sdk import SECRET, agent_model, lookup_secret, run_config

CLIENT_TOOL = {"type": "function", "function": {"name": "lookup", "description": "Look a name up",
                                                 "parameters": {"type": "object", "properties": {}}}}
KEYS = {"a": {"key": "sk-key-a"}, "b": {"key": "sk-key-b"}}


def request_spans(stack: Stack, route: str) -> list[Any]:
    return [s for s in stack.spans() if s.parent is None and s.name == f"POST {route}"]


def sources(stack: Stack, route: str) -> list[str]:
    return [(s.attributes or {}).get(names.ATTR_TRAJECTORY_SOURCE) for s in request_spans(stack, route)]


def trajectories(stack: Stack, route: str) -> list[str]:
    return [(s.attributes or {})[names.ATTR_CONVERSATION_ID] for s in request_spans(stack, route)]


@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_an_agents_sdk_run_with_a_client_tool_and_a_gateway_tool_is_one_trajectory(stack: Stack,
                                                                                         api: str) -> None:
    for _ in range(3):
        stack.script.then(agent_model)
    agent = Agent(name="helper", instructions="Be brief.", tools=[lookup_secret], model="test-model")
    result = await Runner.run(agent, "Add 2 and 3, then tell me the door secret.", run_config=run_config(stack, api))
    assert result.final_output == f"The sum is 5 and the secret is {SECRET}."
    route = "/v1/responses" if api == "responses" else "/v1/chat/completions"
    (trajectory,) = set(trajectories(stack, route))
    # The SDK's Responses model sends the whole input again, with the call's result (no previous_response_id).
    assert sources(stack, route) == ["new", "call_ids"]
    await stack.store.flushed()
    reader = stack.observability.trajectory_reader()
    assert reader is not None
    listed = reader.list_trajectories(tool=None, outcome=None, since=None, model=None, limit=50, key=None)
    assert [(row["id"], row["requests"]) for row in listed] == [(trajectory, 2)]
    page = await stack.http.get("/ui/trajectories", headers=AUTH)
    assert page.status == 200
    text = await page.text()
    assert trajectory in text
    assert text.count('href="/ui/trajectories/') == 1  # one trajectory listed, not one a step


@pytest.mark.parametrize("stream", [False, True])
async def test_a_chat_follow_up_with_the_client_tools_result_joins_the_trajectory(stack: Stack,
                                                                                 stream: bool) -> None:
    stack.script.then(Reply(tool_calls=[("lookup", {})]), Reply(content="found it"))
    first = await stack.ask(stream, messages=USER, tools=[CLIENT_TOOL])
    (call,) = first.tool_calls
    follow_up = [*USER, {"role": "assistant", "content": None, "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": call["id"], "content": "42"}]
    second = await stack.ask(stream, messages=follow_up, tools=[CLIENT_TOOL])
    assert second.content == "found it"
    assert second.headers["x-trajectory-id"] == first.headers["x-trajectory-id"]
    assert sources(stack, "/v1/chat/completions") == ["new", "call_ids"]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_response_continued_by_previous_response_id_joins_the_trajectory(stack: Stack,
                                                                                stream: bool) -> None:
    stack.script.then(Reply(content="hello"), Reply(content="again"))
    first = await stack.respond(stream, input="hi")
    second = await stack.respond(stream, input="and again", previous_response_id=first.id)
    assert second.text == "again"
    assert second.headers["x-trajectory-id"] == first.headers["x-trajectory-id"]
    assert sources(stack, "/v1/responses") == ["new", "previous_response"]


async def test_the_header_and_the_metadata_still_name_the_trajectory(stack: Stack) -> None:
    stack.script.then(Reply(content="one"), Reply(content="two"))
    await stack.client.chat.completions.create(model="m", messages=USER, extra_headers={"X-Trajectory-Id": "mine"})
    await stack.client.chat.completions.create(model="m", messages=USER, metadata={"trajectory_id": "theirs"})
    assert sources(stack, "/v1/chat/completions") == ["header", "metadata"]
    assert trajectories(stack, "/v1/chat/completions") == ["mine", "theirs"]


async def _client_call_of(client: AsyncOpenAI) -> dict[str, Any]:
    answer = await client.chat.completions.create(model="m", messages=USER, tools=[CLIENT_TOOL])  # type: ignore[list-item]
    calls = answer.choices[0].message.tool_calls or []
    return calls[0].model_dump()


@pytest.mark.parametrize("shared", [False, True], ids=["memory", "redis"])
async def test_two_keys_with_the_same_call_id_never_join(make_stack: StackFactory, redis_up: RedisServer,
                                                         shared: bool) -> None:
    stack = await make_stack(keys=KEYS, **({"state_url": redis_up.url} if shared else {}))
    stack.script.then(Reply(tool_calls=[("lookup", {})]), Reply(content="a's answer"), Reply(content="b's answer"),
                      Reply(content="a's again"))
    client_a = AsyncOpenAI(base_url=f"{stack.url}/v1", api_key="sk-key-a", max_retries=0)
    client_b = AsyncOpenAI(base_url=f"{stack.url}/v1", api_key="sk-key-b", max_retries=0)
    try:
        call = await _client_call_of(client_a)
        follow_up = [*USER, {"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": call["id"], "content": "42"}]
        # Key b sends a follow-up carrying key a's call id: it learns nothing of a's trajectory.
        await client_a.chat.completions.create(model="m", messages=follow_up, tools=[CLIENT_TOOL])  # type: ignore[arg-type]
        await client_b.chat.completions.create(model="m", messages=follow_up, tools=[CLIENT_TOOL])  # type: ignore[arg-type]
    finally:
        await client_a.close()
        await client_b.close()
    first, own, other = trajectories(stack, "/v1/chat/completions")
    assert own == first
    assert other != first
    assert sources(stack, "/v1/chat/completions") == ["new", "call_ids", "new"]


async def test_a_client_session_header_names_the_trajectory_per_key(make_stack: StackFactory) -> None:
    stack = await make_stack(keys=KEYS)
    stack.script.then(*(Reply(content=f"answer {n}") for n in range(3)))
    for key in ("sk-key-a", "sk-key-a", "sk-key-b"):
        sent = await stack.http.post("/v1/responses", json={"model": "m", "input": "hi"},
                                     headers={"Authorization": f"Bearer {key}", "session-id": "run-1"})
        assert sent.status == 200, await sent.text()
    first, second, other = trajectories(stack, "/v1/responses")
    assert first == second != other
    assert "run-1" not in first  # a digest of the key and the session, not the client's id
    assert sources(stack, "/v1/responses") == ["session_header"] * 3


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_a_request_sending_tools_empty_gets_no_gateway_tools(make_stack: StackFactory, api: str) -> None:
    stack = await make_stack()
    stack.script.then(Reply(content="summary"), Reply(content="with tools"))
    for tools in ([], None):
        extra: dict[str, Any] = {} if tools is None else {"tools": tools}
        if api == "chat":
            await stack.client.chat.completions.create(model="m", messages=USER, **extra)
        else:
            await stack.client.responses.create(model="m", input="compact this", **extra)
    empty, default = stack.upstream_requests
    assert empty.get("tools") == []  # as the client sent it: no gateway tools
    assert [t.get("name") or t["function"]["name"] for t in default["tools"]] == ["read_file", "add"]


async def test_the_setting_offers_gateway_tools_on_tools_empty(make_stack: StackFactory) -> None:
    stack = await make_stack(offer_tools_on_empty_tools=True)
    stack.script.then(Reply(content="summary"))
    await stack.client.responses.create(model="m", input="compact this", tools=[])
    (sent,) = stack.upstream_requests
    assert [t["name"] for t in sent["tools"]] == ["read_file", "add"]
