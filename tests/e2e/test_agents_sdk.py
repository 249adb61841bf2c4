"""The OpenAI Agents SDK pointed at the gateway: an agent with a function tool of its own runs to
its final output while the gateway runs its own tool in the same run, with the SDK's default
Responses model and with its Chat Completions model: the SDK's own OpenAI provider, handed an
openai client whose `base_url` is the gateway, picks the model for a model name."""

from __future__ import annotations

from typing import Any

import pytest
from agents import Agent, OpenAIProvider, RunConfig, Runner, function_tool

from gateway.demo.model import Reply
from telemetry import names
from tests.conftest import Stack, tool_call_spans, tree

SECRET = "swordfish"


def results_by_tool(body: dict[str, Any]) -> dict[str, str]:
    """What each tool returned so far, as the model sees the conversation."""
    names_by_id = {call["id"]: call["function"]["name"] for m in body["messages"] for call in m.get("tool_calls") or []}
    return {names_by_id[m["tool_call_id"]]: m["content"] for m in body["messages"]
            if m.get("role") == "tool" and m.get("tool_call_id") in names_by_id}


def agent_model(body: dict[str, Any]) -> Reply:
    """Adds with the gateway's tool, asks the agent's own tool for a secret, then answers with both."""
    done = results_by_tool(body)
    if "add" not in done:
        return Reply(tool_calls=[("add", {"a": 2, "b": 3})])
    if "lookup_secret" not in done:
        return Reply(tool_calls=[("lookup_secret", {"name": "door"})])
    return Reply(content=f"The sum is {done['add']} and the secret is {done['lookup_secret']}.")


@function_tool
def lookup_secret(name: str) -> str:
    """Look up a secret by name.

    Args:
        name: which secret
    """
    return SECRET if name == "door" else "unknown"


def run_config(stack: Stack, api: str) -> RunConfig:
    """The SDK's own OpenAI provider on the gateway: its default model kind is the Responses one.
    (Given a `base_url` instead, it would use the SDK's module-wide HTTP client, which outlives each
    test's event loop.)"""
    use_responses = None if api == "responses" else False
    provider = OpenAIProvider(openai_client=stack.client, use_responses=use_responses)
    return RunConfig(model_provider=provider, tracing_disabled=True)


async def final_output(agent: Agent[Any], prompt: str, config: RunConfig, streamed: bool) -> Any:
    """The agent's final output, run to its end with `Runner.run` or `Runner.run_streamed`."""
    if not streamed:
        return (await Runner.run(agent, prompt, run_config=config)).final_output
    running = Runner.run_streamed(agent, prompt, run_config=config)
    async for _ in running.stream_events():
        pass
    return running.final_output


@pytest.mark.parametrize("api", ["responses", "chat"])
@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_an_agent_runs_to_its_final_output_beside_the_gateways_tool(stack: Stack, api: str,
                                                                          streamed: bool) -> None:
    for _ in range(3):
        stack.script.then(agent_model)
    agent = Agent(name="helper", instructions="Be brief.", tools=[lookup_secret], model="test-model")
    final = await final_output(agent, "Add 2 and 3, then tell me the door secret.", run_config(stack, api), streamed)
    assert final == f"The sum is 5 and the secret is {SECRET}."
    first, second, third = stack.upstream_requests
    path_key = "input" if api == "responses" else "messages"
    assert all(path_key in body for body in (first, second, third))
    offered = [t.get("name") or t.get("function", {}).get("name") for t in first["tools"]]
    assert offered == ["lookup_secret", "read_file", "add"]
    gateway_calls = tool_call_spans(stack, None)
    assert [(s.attributes or {}).get(names.ATTR_TOOL_NAME) for s in gateway_calls] == ["add"]
    assert (gateway_calls[0].attributes or {})[names.ATTR_OUTCOME] == "ok"
    roots = [s for s in stack.spans() if s.parent is None]
    route = "/v1/responses" if api == "responses" else "/v1/chat/completions"
    assert [r.name for r in roots] == [f"POST {route}", f"POST {route}"]  # two requests: one per model turn
    assert len(tree(stack.spans(format(roots[0].context.trace_id, "032x")))["chat"]) == 2  # type: ignore[union-attr]


async def test_the_agent_never_sees_the_gateways_call(stack: Stack) -> None:
    for _ in range(3):
        stack.script.then(agent_model)
    agent = Agent(name="helper", tools=[lookup_secret], model="test-model")
    result = await Runner.run(agent, "Add 2 and 3, then tell me the door secret.",
                              run_config=run_config(stack, "responses"))
    called = [getattr(item.raw_item, "name", None) for item in result.new_items if item.type == "tool_call_item"]
    assert called == ["lookup_secret"]
