"""A conversation goes on after the gateway forgot what it held of it (a held turn expired, was
pushed out, or lost in a restart; a `resp_tspan_...` id it no longer knows): the model sees the
conversation as the client has it, without the gateway's rounds, and the request span and a
counter say so. Through the real openai client and the Agents SDK; never a 409."""

from __future__ import annotations

from typing import Any

import pytest
from agents import Agent, Runner

from gateway.demo.model import Reply
from gateway.state import split_call_id
from telemetry import names
from tests.conftest import Stack, StackFactory
from tests.e2e.test_agents_sdk import SECRET, agent_model, lookup_secret, run_config

FORGETFUL = {"pending_turn_ttl_seconds": 1e-9}  # every held turn and answer id is forgotten at once
ASK = {"name": "ask_human", "description": "Ask the user",
       "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}
CHAT_TOOL = {"type": "function", "function": ASK}
RESPONSES_TOOL = {"type": "function", "strict": False, **ASK}


def lost_requests(stack: Stack, route: str) -> list[dict[str, Any]]:
    """The attributes of the request spans that continued a turn the gateway no longer held."""
    return [dict(s.attributes or {}) for s in stack.spans() if (s.attributes or {}).get(names.ATTR_HTTP_ROUTE) == route
            and (s.attributes or {}).get(names.ATTR_HELD_TURN) == names.HELD_TURN_LOST]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_chat_follow_up_for_a_forgotten_turn_goes_on_with_the_clients_copy(
        make_stack: StackFactory, stream: bool) -> None:
    stack = await make_stack(**FORGETFUL)
    stack.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 2}), ("ask_human", {"q": "sure?"})]),
                      Reply(content="done"))
    question = {"role": "user", "content": "add, then ask me"}
    first = await stack.ask(stream, messages=[question], tools=[CHAT_TOOL])
    [call] = first.tool_calls
    assert call["id"].startswith("tspan_")
    follow_up = [question, {"role": "assistant", "content": first.content, "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": call["id"], "content": "yes"}]
    answer = await stack.ask(stream, messages=follow_up, tools=[CHAT_TOOL])
    assert answer.content == "done"
    [_, original] = split_call_id(call["id"]) or ("", "")
    sent = stack.upstream_requests[-1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"]  # the gateway's add round is gone
    assert [c["id"] for c in sent[1]["tool_calls"]] == [original]
    assert sent[2]["tool_call_id"] == original
    assert len(lost_requests(stack, "/v1/chat/completions")) == 1
    assert stack.metric(names.METRIC_HELD_TURNS_LOST, route="/v1/chat/completions") == 1


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_responses_follow_up_for_a_forgotten_turn_goes_on(make_stack: StackFactory, stream: bool) -> None:
    """The client continues from the answer's id with its call's result: the id is forgotten
    with the turn, so the request goes on from its own input, the result told as a message
    (a provider refuses a result without its call)."""
    stack = await make_stack(**FORGETFUL)
    stack.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 2}), ("ask_human", {"q": "sure?"})]),
                      Reply(content="done"))
    first = await stack.respond(stream, input="add, then ask me", tools=[RESPONSES_TOOL])
    [call] = first.calls
    assert first.id.startswith("resp_tspan_")
    answer = await stack.respond(stream, previous_response_id=first.id, tools=[RESPONSES_TOOL], input=[
        {"type": "function_call_output", "call_id": call["call_id"], "output": "yes"}])
    assert answer.text == "done"
    sent = stack.upstream_requests[-1]
    assert "previous_response_id" not in sent
    [told] = sent["input"]
    assert told["role"] == "user"
    assert told["content"][-1] == {"type": "input_text", "text": "yes"}
    assert len(lost_requests(stack, "/v1/responses")) == 1
    assert stack.metric(names.METRIC_HELD_TURNS_LOST, route="/v1/responses") == 1


async def test_a_forgotten_answer_id_goes_on_from_the_new_input(make_stack: StackFactory) -> None:
    stack = await make_stack(**FORGETFUL)
    stack.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 2})]), Reply(content="3"), Reply(content="again"))
    first = await stack.respond(False, input="add")
    assert first.id.startswith("resp_tspan_")
    answer = await stack.respond(False, input="and again", previous_response_id=first.id)
    assert answer.text == "again"
    sent = stack.upstream_requests[-1]
    assert "previous_response_id" not in sent
    assert sent["input"] == "and again"
    assert len(lost_requests(stack, "/v1/responses")) == 1


@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_an_agents_sdk_run_survives_a_forgotten_turn(make_stack: StackFactory, api: str) -> None:
    """The agent's own tool is called after the gateway's ran: its follow-up names a turn the
    gateway has already forgotten. The run goes on: the model, no longer seeing its earlier call
    of the gateway's tool, calls it again, and the run ends with the right answer."""
    stack = await make_stack(**FORGETFUL)
    for _ in range(5):
        stack.script.then(agent_model)
    agent = Agent(name="helper", instructions="Be brief.", tools=[lookup_secret], model="test-model")
    result = await Runner.run(agent, "Add 2 and 3, then tell me the door secret.", run_config=run_config(stack, api))
    assert result.final_output == f"The sum is 5 and the secret is {SECRET}."
    route = "/v1/responses" if api == "responses" else "/v1/chat/completions"
    assert len(lost_requests(stack, route)) == 1
