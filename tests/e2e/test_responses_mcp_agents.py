"""The Agents SDK's HostedMCPTool through the gateway to a scripted Anthropic upstream: the gateway
runs the tool on a real MCP server (tests/mcp/servers/files.py over streamable HTTP) that the
operator allows in responses_mcp_servers. The SDK approves or denies each call in OpenAI's
`mcp_approval_request` / `mcp_approval_response` items: through `on_approval_request`, or by the
run's interruptions and `RunState.approve` / `reject` then a second run; with `Runner.run` and
`Runner.run_streamed`, and once chaining by `previous_response_id`. An approved call runs once on
the server, a denied one never does and the model is told the reason."""

from __future__ import annotations

from typing import Any

import pytest
from agents import Agent, HostedMCPTool, MCPToolApprovalRequest, RunConfig, Runner
from agents.items import ToolApprovalItem
from agents.result import RunResult, RunResultStreaming
from openai.types.responses.tool_param import Mcp

from gateway.demo.model import Reply
from telemetry import names
from tests.conftest import Stack, StackFactory
from tests.e2e.test_agents_sdk import results_by_tool, run_config
from tests.mcp.conftest import HttpServer, Recorded, files, http_server, recorded

__all__ = ["files", "http_server", "recorded"]  # the fixtures of tests/mcp, used here

pytestmark = pytest.mark.slow

TOOL = "files__read_file"  # the name the model is offered: the entry's name, then the server's tool name
ASK = "What does /etc/motd say?"
CONTENTS = "contents of /etc/motd from 0"  # what the test server answers
REASON = "not on a Friday"
Result = RunResult | RunResultStreaming


def reader_model(body: dict[str, Any]) -> Reply:
    """Reads /etc/motd with the server's tool, then says what came back."""
    done = results_by_tool(body)
    if TOOL not in done:
        return Reply(tool_calls=[(TOOL, {"path": "/etc/motd"})])
    return Reply(content=f"It said: {done[TOOL]}")


async def stack_on(make_stack: StackFactory, server: HttpServer) -> Stack:
    stack = await make_stack(upstream_kind="anthropic", responses_mcp_servers={"files": {"url": server.url}})
    stack.script.then(reader_model, reader_model)
    return stack


def hosted(server: HttpServer, approve: bool | None = None) -> HostedMCPTool:
    """The files server as the SDK declares it; `approve` set: decided by its callback."""
    config: Mcp = {"type": "mcp", "server_label": "files", "server_url": server.url, "require_approval": "always"}
    if approve is None:
        return HostedMCPTool(tool_config=config)

    def decide(request: MCPToolApprovalRequest) -> Any:
        assert (request.data.server_label, request.data.name) == ("files", "read_file")
        return {"approve": True} if approve else {"approve": False, "reason": REASON}

    return HostedMCPTool(tool_config=config, on_approval_request=decide)


async def run(agent: Agent[Any], given: Any, config: RunConfig, streamed: bool, **options: Any) -> Result:
    if not streamed:
        return await Runner.run(agent, given, run_config=config, **options)
    running = Runner.run_streamed(agent, given, run_config=config, **options)
    async for _ in running.stream_events():
        pass
    return running


def told(stack: Stack) -> str:
    """What the model was last given as the tool's result, in the Anthropic request it got."""
    blocks = [block for message in stack.upstream_requests[-1]["messages"] if isinstance(message["content"], list)
              for block in message["content"]]
    uses = {block["id"] for block in blocks if block["type"] == "tool_use" and block["name"] == TOOL}
    [result] = [block for block in blocks if block["type"] == "tool_result" and block["tool_use_id"] in uses]
    content = result["content"]
    return content if isinstance(content, str) else "".join(part.get("text", "") for part in content)


def assert_listed_and_ran(stack: Stack, recorded: Recorded, result: Result, approved: bool,
                          listed: Result | None = None) -> None:
    """The model was offered the server's tool and the SDK shown its list (in `listed`, the first
    run's result, or `result`); the call ran once if approved, never if denied."""
    first = stack.upstream_requests[0]
    assert TOOL in [tool.get("name") or tool.get("function", {}).get("name") for tool in first.get("tools", [])]
    lists = [item.raw_item for item in (listed or result).new_items if item.type == "mcp_list_tools_item"]
    assert [(getattr(item, "server_label", None), [t.name for t in getattr(item, "tools", [])]) for item in lists
            ][:1] == [("files", ["read_file", "fail", "hang", "stats", "picture", "grow"])]
    outcomes = [(s.attributes or {}).get(names.ATTR_OUTCOME) for s in stack.spans()
                if s.name == names.SPAN_TOOL_CALL and (s.attributes or {}).get(names.ATTR_TOOL_NAME) == TOOL]
    if approved:
        assert [call["args"] for call in recorded.calls()] == [{"path": "/etc/motd", "offset": 0}]
        assert told(stack) == CONTENTS
        assert result.final_output == f"It said: {CONTENTS}"
        assert "ok" in outcomes
    else:
        assert recorded.calls() == []
        assert CONTENTS not in told(stack)
        assert REASON in told(stack)
        assert result.final_output == f"It said: {told(stack)}"
        assert "ok" not in outcomes


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
@pytest.mark.parametrize("approve", [True, False], ids=["approved", "denied"])
async def test_on_approval_request_decides_in_the_same_run(
        make_stack: StackFactory, files: tuple[HttpServer, Recorded], approve: bool, streamed: bool) -> None:
    server, recorded = files
    stack = await stack_on(make_stack, server)
    agent = Agent(name="reader", instructions="Be brief.", tools=[hosted(server, approve)], model="test-model")
    result = await run(agent, ASK, run_config(stack, "responses"), streamed)
    assert result.interruptions == []
    assert_listed_and_ran(stack, recorded, result, approve)


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
@pytest.mark.parametrize("approve", [True, False], ids=["approved", "denied"])
async def test_without_a_callback_the_run_stops_for_the_decision(
        make_stack: StackFactory, files: tuple[HttpServer, Recorded], approve: bool, streamed: bool) -> None:
    server, recorded = files
    stack = await stack_on(make_stack, server)
    agent = Agent(name="reader", instructions="Be brief.", tools=[hosted(server)], model="test-model")
    config = run_config(stack, "responses")
    paused = await run(agent, ASK, config, streamed)
    [asked] = paused.interruptions
    assert isinstance(asked, ToolApprovalItem)
    assert (getattr(asked.raw_item, "type", None), getattr(asked.raw_item, "name", None)) == (
        "mcp_approval_request", "read_file")
    assert recorded.calls() == []  # nothing runs before the decision
    state = paused.to_state()
    if approve:
        state.approve(asked)
    else:
        state.reject(asked, rejection_message=REASON)
    result = await run(agent, state, config, streamed)
    assert result.interruptions == []
    assert_listed_and_ran(stack, recorded, result, approve, listed=paused)


async def test_an_approval_by_previous_response_id(make_stack: StackFactory,
                                                   files: tuple[HttpServer, Recorded]) -> None:
    """auto_previous_response_id: the follow-up carries only the mcp_approval_response, so the
    gateway continues the conversation it held for the approval."""
    server, recorded = files
    stack = await stack_on(make_stack, server)
    agent = Agent(name="reader", instructions="Be brief.", tools=[hosted(server)], model="test-model")
    config = run_config(stack, "responses")
    paused = await Runner.run(agent, ASK, run_config=config, auto_previous_response_id=True)
    [asked] = paused.interruptions
    state = paused.to_state()
    state.approve(asked)
    result = await Runner.run(agent, state, run_config=config, auto_previous_response_id=True)
    assert result.interruptions == []
    assert_listed_and_ran(stack, recorded, result, approved=True, listed=paused)
