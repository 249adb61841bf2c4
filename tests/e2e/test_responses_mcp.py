"""Responses `mcp` tools run by the gateway on a non-OpenAI upstream (issue 60), through the official
`openai` client: a real MCP server (tests/mcp/servers/files.py over streamable HTTP) on the
operator's allow list, the scripted model on an Anthropic upstream. The answer shows the server's
tool list and the calls as OpenAI's own items and events; `allowed_tools` narrows what the model is
offered; `require_approval` hands back an `mcp_approval_request` that the client answers in its
next request, by the whole input or by previous_response_id; an approval replayed with edited
arguments runs nothing."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from openai.types.responses.response_output_item import McpApprovalRequest, McpCall, McpListTools
from pydantic import TypeAdapter

from gateway.demo.model import Reply
from telemetry import names
from tests.conftest import AUTH, STREAM, USER, Stack, StackFactory, tool_call_spans
from tests.mcp.conftest import HttpServer, Recorded, http_server, recorded

__all__ = ["http_server", "recorded"]  # the fixtures of tests/mcp, used here

pytestmark = pytest.mark.slow  # an MCP server as a process of its own

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
NEVER = {"type": "mcp", "server_label": "files", "require_approval": "never"}
ALWAYS = {"type": "mcp", "server_label": "files", "require_approval": "always"}
READ = Reply(tool_calls=[("files__read_file", {"path": "notes.txt"})])


@pytest.fixture
async def stack(make_stack: StackFactory, http_server: HttpServer) -> Stack:
    return await make_stack(upstream_kind="anthropic", responses_mcp_servers={"files": {"url": http_server.url}})


async def _create(stack: Stack, stream: bool, **request: Any) -> tuple[Response, list[Any]]:
    """The answer as openai's own Response, and its events as openai's own event types."""
    request = {"model": "claude-sonnet-4-5", **request}
    if not stream:
        return await stack.client.responses.create(**request), []
    events = [event async for event in await stack.client.responses.create(stream=True, **request)]
    for event in events:
        EVENTS.validate_python(event.model_dump())
    final = events[-1]
    assert final.type == "response.completed"
    return final.response, events


def _upstream_tools(stack: Stack, index: int = 0) -> set[str]:
    return {tool["name"] for tool in stack.upstream_requests[index].get("tools", [])}


def _told(stack: Stack) -> str:
    """Every tool result the upstream's last request carries, as text."""
    messages = stack.upstream_requests[-1]["messages"]
    return json.dumps([block for m in messages if isinstance(m["content"], list) for block in m["content"]
                       if block.get("type") == "tool_result"])


@STREAM
async def test_a_call_never_approved_is_listed_run_and_shown(stack: Stack, recorded: Recorded, stream: bool) -> None:
    stack.script.then(READ, Reply(content="It says hello."))
    response, events = await _create(stack, stream, input=USER[0]["content"], tools=[NEVER])
    listed, call, message = response.output
    assert isinstance(listed, McpListTools)
    assert isinstance(call, McpCall)
    assert listed.server_label == "files"
    assert "read_file" in {tool.name for tool in listed.tools}
    assert (call.server_label, call.name, call.status) == ("files", "read_file", "completed")
    assert json.loads(call.arguments) == {"path": "notes.txt"}
    assert call.output == "contents of notes.txt from 0"
    assert message.type == "message"
    assert response.output_text == "It says hello."
    assert response.tools[0].type == "mcp"  # the client's own tools, as it sent them
    assert [entry["tool"] for entry in recorded.calls()] == ["read_file"]
    assert "files__read_file" in _upstream_tools(stack)
    assert "mcp" not in {tool.get("type") for tool in stack.upstream_requests[0]["tools"]}
    if stream:
        kinds = [event.type for event in events]
        start = kinds.index("response.mcp_list_tools.in_progress") - 1
        assert kinds[start:start + 12] == [
            "response.output_item.added", "response.mcp_list_tools.in_progress", "response.mcp_list_tools.completed",
            "response.output_item.done", "response.output_item.added", "response.mcp_call.in_progress",
            "response.mcp_call_arguments.delta", "response.mcp_call_arguments.done", "response.mcp_call.completed",
            "response.output_item.done", "response.output_item.added", "response.content_part.added"]
        assert kinds[:2] == ["response.created", "response.in_progress"]
        assert kinds[-1] == "response.completed"
    trace = next(iter(stack.spans())).context.trace_id
    spans = tool_call_spans(stack, format(trace, "032x"))
    [span] = [s for s in spans if (s.attributes or {}).get(names.ATTR_TOOL_NAME) == "files__read_file"]
    steps = {s.name for s in stack.spans() if s.parent is not None and s.parent.span_id == span.context.span_id}
    assert {names.SPAN_TOOL_PARSE, names.SPAN_TOOL_EXECUTE} <= steps
    await stack.store.flushed()
    with sqlite3.connect(stack.store.path) as db:
        rows = db.execute("SELECT tool, outcome FROM tool_calls").fetchall()
    assert rows == [("files__read_file", "ok")]
    with sqlite3.connect(stack.store.path) as db:
        [(trajectory,)] = db.execute("SELECT DISTINCT trajectory_id FROM tool_calls").fetchall()
    page = await stack.http.get(f"/ui/trajectories/{trajectory}", headers=AUTH)
    assert page.status == 200
    assert "files__read_file" in await page.text()  # on the page, as any tool call


async def test_the_provider_runs_them_for_an_openai_upstream(make_stack: StackFactory, http_server: HttpServer,
                                                            recorded: Recorded) -> None:
    stack = await make_stack(upstream_kind="openai", responses_mcp_servers={"files": {"url": http_server.url}},
                             responses_mcp_runner="provider")
    stack.script.then(Reply(content="OpenAI ran it."))
    spec = {**NEVER, "server_url": "https://mcp.example.com/sse"}  # not on the list: OpenAI connects, not the gateway
    answer = {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": True}
    response, _ = await _create(stack, False, input=[*USER, answer], tools=[spec])
    assert response.output_text == "OpenAI ran it."
    [upstream] = stack.upstream_requests
    assert [tool for tool in upstream["tools"] if tool["type"] == "mcp"] == [spec]
    assert upstream["input"][-1] == answer
    assert recorded.calls() == []


def _replayed(response: Response) -> list[dict[str, Any]]:
    """An answer's output as the next request's input (as the Agents SDK resends it)."""
    return [item.model_dump(exclude_none=True) for item in response.output]


async def _asked(stack: Stack, stream: bool, **request: Any) -> tuple[Response, McpApprovalRequest]:
    """A first request whose call waits for the client's approval."""
    stack.script.then(READ)
    first, _ = await _create(stack, stream, input=USER[0]["content"], tools=[ALWAYS], **request)
    listed, request = first.output
    assert isinstance(listed, McpListTools)
    assert isinstance(request, McpApprovalRequest)
    assert (request.server_label, request.name, json.loads(request.arguments)) == ("files", "read_file",
                                                                                    {"path": "notes.txt"})
    return first, request


@STREAM
@pytest.mark.parametrize("approve", [True, False], ids=["approved", "denied"])
async def test_an_approval_by_the_whole_input(stack: Stack, recorded: Recorded, stream: bool, approve: bool) -> None:
    first, request = await _asked(stack, stream)
    assert recorded.calls() == []
    stack.script.then(Reply(content="Done."))
    answer = {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": approve,
              **({} if approve else {"reason": "not that file"})}
    second, _ = await _create(stack, stream, input=[*USER, *_replayed(first), answer], tools=[ALWAYS])
    assert second.output_text == "Done."
    if approve:
        call, _message = second.output
        assert isinstance(call, McpCall)
        assert (call.status, call.approval_request_id) == ("completed", request.id)
        assert [entry["args"] for entry in recorded.calls()] == [{"path": "notes.txt", "offset": 0}]
        assert "contents of notes.txt" in _told(stack)
    else:
        assert [item.type for item in second.output] == ["message"]
        assert recorded.calls() == []
        assert "not that file" in _told(stack)
    assert len(stack.upstream_requests) == 2  # the decided call ran before the model was called again


@STREAM
async def test_an_approval_replayed_with_edited_arguments_runs_nothing(stack: Stack, recorded: Recorded,
                                                                      stream: bool) -> None:
    first, request = await _asked(stack, stream)
    replayed = _replayed(first)
    replayed[1] = {**replayed[1], "arguments": json.dumps({"path": "/etc/shadow"})}
    answer = {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}
    second, events = await _create(stack, stream, input=[*USER, *replayed, answer], tools=[ALWAYS])
    assert recorded.calls() == []
    [asked_again] = second.output
    assert isinstance(asked_again, McpApprovalRequest)
    assert json.loads(asked_again.arguments) == {"path": "notes.txt"}  # what would run: the model's call
    assert asked_again.id != request.id
    assert len(stack.upstream_requests) == 1  # handed back at once, with no provider call
    if stream:
        assert [event.type for event in events[:2]] == ["response.created", "response.in_progress"]


async def test_allowed_tools_narrow_the_offer(stack: Stack, recorded: Recorded) -> None:
    stack.script.then(Reply(tool_calls=[("files__fail", {})]), Reply(content="Sorry."))
    spec = {**NEVER, "allowed_tools": ["read_file"]}
    response, _ = await _create(stack, False, input=USER[0]["content"], tools=[spec])
    assert _upstream_tools(stack) & {"files__read_file", "files__fail"} == {"files__read_file"}
    [listed] = [item for item in response.output if isinstance(item, McpListTools)]
    assert [tool.name for tool in listed.tools] == ["read_file"]
    assert recorded.calls() == []
    assert "There is no tool named 'files__fail'" in _told(stack)


@STREAM
@pytest.mark.parametrize("approve", [True, False], ids=["approved", "denied"])
async def test_an_approval_by_previous_response_id(stack: Stack, recorded: Recorded, stream: bool,
                                                   approve: bool) -> None:
    first, request = await _asked(stack, stream)
    stack.script.then(Reply(content="Done."))
    answer = {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": approve}
    second, _ = await _create(stack, stream, input=[answer], previous_response_id=first.id, tools=[ALWAYS])
    assert second.output_text == "Done."
    assert second.previous_response_id == first.id
    upstream = stack.upstream_requests[-1]
    assert upstream["messages"][0]["content"] == [{"type": "text", "text": USER[0]["content"]}]  # held for it
    if approve:
        assert [item.type for item in second.output] == ["mcp_call", "message"]
        assert [entry["tool"] for entry in recorded.calls()] == ["read_file"]
    else:
        assert [item.type for item in second.output] == ["message"]
        assert recorded.calls() == []
        assert "denied" in _told(stack).lower() or "not approved" in _told(stack).lower()


async def test_the_approval_joins_the_trajectory_of_its_request(stack: Stack) -> None:
    stack.script.then(READ, Reply(content="Done."))
    body = {"model": "claude-sonnet-4-5", "input": USER[0]["content"], "tools": [ALWAYS]}
    async with stack.http.post("/v1/responses", json=body, headers=AUTH) as first:
        assert first.status == 200
        output = (await first.json())["output"]
    [request] = [item for item in output if item["type"] == "mcp_approval_request"]
    answer = {"type": "mcp_approval_response", "approval_request_id": request["id"], "approve": True}
    follow_up = {**body, "input": [*USER, *output, answer]}
    async with stack.http.post("/v1/responses", json=follow_up, headers=AUTH) as second:
        assert second.status == 200
    assert second.headers["X-Trajectory-Id"] == first.headers["X-Trajectory-Id"]


async def test_another_key_replaying_an_approval_runs_nothing(make_stack: StackFactory, http_server: HttpServer,
                                                              recorded: Recorded) -> None:
    keys = {"one": {"key": "sk-one-0000001"}, "two": {"key": "sk-two-0000002"}}
    stack = await make_stack(upstream_kind="anthropic", keys=keys,
                             responses_mcp_servers={"files": {"url": http_server.url}})
    stack.script.then(READ, Reply(content="I could not read it."))
    body = {"model": "claude-sonnet-4-5", "input": USER[0]["content"], "tools": [ALWAYS]}
    async with stack.http.post("/v1/responses", json=body, headers={"Authorization": "Bearer sk-one-0000001"}) as first:
        output = (await first.json())["output"]
    [request] = [item for item in output if item["type"] == "mcp_approval_request"]
    answer = {"type": "mcp_approval_response", "approval_request_id": request["id"], "approve": True}
    follow_up = {**body, "input": [*USER, *output, answer]}
    async with stack.http.post("/v1/responses", json=follow_up,
                               headers={"Authorization": "Bearer sk-two-0000002"}) as second:
        assert second.status == 200, await second.text()
    assert recorded.calls() == []
    assert "could not be applied" in json.dumps(stack.upstream_requests[-1]["messages"])


async def test_an_approval_by_previous_response_id_on_a_chained_upstream(make_stack: StackFactory,
                                                                         http_server: HttpServer,
                                                                         recorded: Recorded) -> None:
    stack = await make_stack(upstream_kind="openai", responses_mcp_servers={"files": {"url": http_server.url}})
    first, request = await _asked(stack, False, store=True)
    stack.script.then(Reply(content="Done."))
    answer = {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}
    second, _ = await _create(stack, False, input=[answer], previous_response_id=first.id, tools=[ALWAYS],
                              store=True)
    assert [item.type for item in second.output] == ["mcp_call", "message"]
    assert [entry["tool"] for entry in recorded.calls()] == ["read_file"]
    upstream = stack.upstream_requests[-1]
    # The provider keeps the turn: the next call continues its response, with only the call's output.
    assert upstream["previous_response_id"] not in (None, first.id)
    [output] = upstream["input"]
    assert output["type"] == "function_call_output"
    assert "contents of notes.txt" in json.dumps(output)
    kept = await stack.client.responses.retrieve(second.id)  # the answer as kept shows the same items
    assert [item.type for item in kept.output] == ["mcp_call", "message"]


async def test_an_mcp_tool_choice_forces_that_tool_and_is_shown_as_sent(stack: Stack) -> None:
    stack.script.then(READ, Reply(content="It says hello."))
    choice = {"type": "mcp", "server_label": "files", "name": "read_file"}
    response, _ = await _create(stack, False, input=USER[0]["content"], tools=[NEVER], tool_choice=choice)
    assert stack.upstream_requests[0]["tool_choice"] == {"type": "tool", "name": "files__read_file"}
    assert stack.upstream_requests[1]["tool_choice"] == {"type": "auto"}  # not forced again once it ran
    assert response.tool_choice.model_dump(exclude_none=True) == choice
