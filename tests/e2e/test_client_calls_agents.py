"""The Agents SDK's own function tool, called through the gateway (issue 36): the model first
renames its argument, the SDK's tool refuses the call and says so, the model corrects it and the
run ends. The gateway checked both calls against the schema the SDK declared: the first is a
client rejection with the did-you-mean on its span, the second a corrected retry of it; both
reached the SDK as the model sent them. Both APIs, run and run_streamed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from agents import Agent, function_tool

from gateway.demo.model import Reply
from telemetry import names
from tests.conftest import Stack
from tests.e2e.test_agents_sdk import final_output, run_config


def tool_outputs(body: dict[str, Any]) -> list[str]:
    """What the agent's tool returned so far, in either API's shape."""
    if "messages" in body:
        return [m["content"] for m in body["messages"] if m.get("role") == "tool"]
    items = body["input"] if isinstance(body.get("input"), list) else []
    return [str(i["output"]) for i in items if i.get("type") == "function_call_output"]


def renaming_model(body: dict[str, Any]) -> Reply:
    """Calls `open_file` with `file` for `path`, then as declared, then answers with what it read."""
    outputs = tool_outputs(body)
    if not outputs:
        return Reply(tool_calls=[("open_file", {"file_path": "notes.txt"})])
    if len(outputs) == 1:
        return Reply(tool_calls=[("open_file", {"path": "notes.txt"})])
    return Reply(content=f"The notes say: {outputs[-1]}")


@function_tool
def open_file(path: str) -> str:
    """Open a file of the project.

    Args:
        path: the file's path
    """
    return f"hello from {path}"


@pytest.mark.parametrize("api", ["responses", "chat"])
@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_the_sdk_tools_renamed_argument_is_seen_and_its_correction_linked(stack: Stack, api: str,
                                                                                streamed: bool) -> None:
    for _ in range(3):
        stack.script.then(renaming_model)
    agent = Agent(name="reader", instructions="Be brief.", tools=[open_file], model="test-model")
    final = await final_output(agent, "What do my notes say?", run_config(stack, api), streamed)
    assert final == "The notes say: hello from notes.txt"
    first_output = tool_outputs(stack.upstream_requests[1])[0]
    assert "hello" not in first_output  # the SDK itself refused the renamed call: it got it as the model sent it

    spans = [s for s in stack.spans() if s.name == names.SPAN_TOOL_CALL]
    assert [(s.attributes or {})[names.ATTR_TOOL_SIDE] for s in spans] == [names.SIDE_CLIENT] * 2
    rejected, ok = spans
    assert (rejected.attributes or {})[names.ATTR_REJECTION_REASON] == "missing_arguments"
    assert (rejected.attributes or {})[names.ATTR_ARGS_UNRECOGNIZED] == ("file_path",)
    assert (rejected.attributes or {})[names.ATTR_ARGS_SUGGESTIONS] == ("file_path->path",)  # the did-you-mean
    assert "did you mean 'path'?" in str(rejected.status.description)
    assert json.loads(str((rejected.attributes or {})[names.ATTR_TOOL_CALL_ARGUMENTS])) == {"file_path": "notes.txt"}
    assert (ok.attributes or {})[names.ATTR_OUTCOME] == "ok"
    assert (ok.attributes or {})[names.ATTR_RETRY_KIND] == "corrected"
    assert [link.context.span_id for link in ok.links] == [rejected.context.span_id]
    assert {(s.attributes or {})[names.ATTR_CONVERSATION_ID] for s in spans} == {
        (s.attributes or {})[names.ATTR_CONVERSATION_ID] for s in stack.spans() if s.parent is None}  # one run
    assert stack.metric(names.METRIC_TOOL_CALLS, tool="open_file", side=names.SIDE_CLIENT) == 2
    # Each result the SDK sent back recorded the SDK's execute step of that call, in the next request.
    steps = [a for s in stack.spans() if s.name == names.SPAN_TOOL_EXECUTE
             and (a := s.attributes or {}).get(names.ATTR_TOOL_SIDE) == names.SIDE_CLIENT]
    assert [(a[names.ATTR_TOOL_CALL_ID], a[names.ATTR_OUTCOME]) for a in steps] == [
        ((c.attributes or {})[names.ATTR_TOOL_CALL_ID], names.OUTCOME_RETURNED) for c in spans]
    assert steps[1][names.ATTR_RESULT_BYTES] == len("hello from notes.txt")
