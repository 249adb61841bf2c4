"""The Responses API's MCP items (gateway.apis.responses.mcp_items) as the answer and its stream
show them: every item and every event read by the openai client's own types, in OpenAI's order,
numbered as the rest of the stream is."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import pydantic
import pytest
from openai.types.responses import Response, ResponseOutputItem, ResponseOutputMessage, ResponseStreamEvent
from openai.types.responses.response_output_item import McpApprovalRequest, McpCall, McpListTools

from gateway.apis.base import Frame
from gateway.apis.responses import RESPONSES
from gateway.apis.responses.answer import read_response
from gateway.apis.responses.mcp_items import McpShown, approval_item, call_error
from gateway.apis.responses.render import ResponseEvents, final_response
from gateway.caller import Caller
from gateway.engine import Finished, Plan, ToolRun, ToolsRan, ToolsStarted, Visible
from gateway.mcp.connection import UNAVAILABLE
from gateway.state import MemoryState
from gateway.tools import ToolOutcome
from tests.conftest import sample_registry

EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)
ITEMS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseOutputItem)
DECLARED = "files__read_file"  # a declared server's tool as the model is offered it
ARGUMENTS = '{"path":"notes.txt"}'
LISTED = {"type": "mcp_list_tools", "id": "mcpl_r1_0", "server_label": "docs", "error": None,
          "tools": [{"name": "read_file", "description": "Reads a file.", "annotations": {"readOnlyHint": True},
                     "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]}
SHOWN = McpShown({DECLARED: ("docs", "read_file")}, lists=(LISTED,))


def body(output: list[dict[str, Any]], rid: str = "resp_1", status: str = "completed") -> dict[str, Any]:
    return {"id": rid, "object": "response", "created_at": 1, "model": "m", "status": status, "output": output,
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}


def call(call_id: str, name: str, arguments: str = ARGUMENTS) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": name,
            "arguments": arguments, "status": "completed"}


REASONING = {"type": "reasoning", "id": "rs_1", "summary": []}
MESSAGE = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
           "content": [{"type": "output_text", "text": "It says hello.", "annotations": []}]}
CALLING = read_response(body([REASONING, call("call_1", DECLARED),
                              call("call_2", "add", '{"a":1,"b":2}')]))
ANSWER = read_response(body([MESSAGE], "resp_2"))


def ok(call_id: str, name: str, content: str = "hello") -> ToolOutcome:
    return ToolOutcome(call_id, name, "ok", content)


async def plan(stream: bool) -> Plan:
    return await RESPONSES.plan({"model": "m", "input": "read notes.txt", "stream": stream},
                                Caller(trajectory_id="t-1", request_id="r-1"), sample_registry(), MemoryState(10, 60))


def finished(outcome: ToolOutcome, client_calls: tuple[Mapping[str, Any], ...] = (), rid: str = "resp_gw") -> Finished:
    mine, own = CALLING.calls[0], CALLING.calls[1]
    runs = (ToolRun(0, mine, outcome), ToolRun(0, own, ok("call_2", "add", "3")))
    turns = (CALLING, ANSWER) if not client_calls else (CALLING,)
    return Finished(turns, client_calls, "stop", False, rid, tool_runs=runs)


def outcomes() -> list[tuple[ToolOutcome, dict[str, Any] | None]]:
    """Each way a call ends, with the `mcp_call.error` it shows as."""
    def failed(status: Any, content: Any, error_type: str) -> ToolOutcome:
        return ToolOutcome("call_1", DECLARED, status, content, error_type=error_type)

    text = [{"type": "text", "text": "no such file"}]
    refused = "MCP server 'docs' refused the call of its tool 'read_file': bad params"
    down = "MCP server 'docs' is unavailable: it is not connected."
    rejected = "Invalid arguments for read_file: 'path' is required"
    return [(ok("call_1", DECLARED), None),
            (failed("error", text, "tool_error"), {"type": "mcp_tool_execution_error", "content": text}),
            (failed("error", "no such file", "tool_error"), {"type": "mcp_tool_execution_error", "content": text}),
            (failed("error", refused, "mcp_error"), {"type": "mcp_protocol_error", "code": -32603, "message": refused}),
            (failed("error", down, UNAVAILABLE), {"type": "http_error", "code": 503, "message": down}),
            (failed("rejected", rejected, "schema_violation"),
             {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": rejected}]}),
            (failed("timeout", "read_file timed out", "timeout"),
             {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": "read_file timed out"}]}),
            (failed("denied", "A reviewer denied the call.", "denied"),
             {"type": "mcp_tool_execution_error",
              "content": [{"type": "text", "text": "A reviewer denied the call."}]})]


@pytest.mark.parametrize(("outcome", "error"), outcomes())
async def test_the_answer_shows_the_lists_and_each_declared_call_as_openai_does(
        outcome: ToolOutcome, error: dict[str, Any] | None) -> None:
    answer = Response.model_validate(final_response(await plan(False), finished(outcome), SHOWN))
    listed, reasoned, called, said = answer.output  # the gateway's own tool ("add") stays hidden, as ever
    assert isinstance(listed, McpListTools)
    assert isinstance(called, McpCall)
    assert reasoned.type == "reasoning"
    assert isinstance(said, ResponseOutputMessage)
    assert listed.model_dump(exclude_none=True) == {k: v for k, v in LISTED.items() if v is not None}
    assert (called.id, called.server_label, called.name, called.arguments) == ("mcp_call_1", "docs", "read_file",
                                                                               ARGUMENTS)
    assert called.status == ("completed" if error is None else "failed")
    assert called.output == ("hello" if error is None else None)
    assert (called.error.model_dump() if called.error else None) == error
    assert call_error(outcome) == error


async def test_without_declared_servers_nothing_changes() -> None:
    done = finished(ok("call_1", DECLARED))
    assert final_response(await plan(False), done)["output"] == [REASONING, MESSAGE]
    events = ResponseEvents(await plan(True))
    assert list(events.started(ToolsStarted(0, CALLING.calls, CALLING))) == []
    assert list(events.ran(ToolsRan(0, CALLING.calls, (ok("call_1", DECLARED), ok("call_2", "add")), CALLING))) == []


def opening() -> list[Visible]:
    opened = body([], status="in_progress")
    return [Visible({"type": "response.created", "sequence_number": 0, "response": opened}, 0),
            Visible({"type": "response.in_progress", "sequence_number": 1, "response": opened}, 0)]


def reasoning_pieces() -> list[Visible]:
    """The first round's reasoning, streamed before its calls (held back by the reader)."""
    return [Visible({"type": f"response.output_item.{step}", "output_index": 0, "item": REASONING,
                     "sequence_number": 2}, 0) for step in ("added", "done")]


def answer_pieces(round_: int) -> list[Visible]:
    """The second round's message, streamed; the provider numbers it 0 in its own response."""
    added = {**MESSAGE, "status": "in_progress", "content": []}
    part = {"type": "output_text", "text": "", "annotations": []}
    return [Visible(piece, round_) for piece in (
        {"type": "response.output_item.added", "output_index": 0, "item": added, "sequence_number": 2},
        {"type": "response.content_part.added", "output_index": 0, "item_id": "msg_1", "content_index": 0,
         "part": part, "sequence_number": 3},
        {"type": "response.output_text.delta", "output_index": 0, "item_id": "msg_1", "content_index": 0,
         "delta": "It says hello.", "logprobs": [], "sequence_number": 4},
        {"type": "response.output_item.done", "output_index": 0, "item": MESSAGE, "sequence_number": 5})]


def streamed(events: ResponseEvents, *steps: Any) -> list[dict[str, Any]]:
    """Each step through the renderer; every frame read by the openai client's event types."""
    frames: list[Frame] = []
    for step in steps:
        shown: Iterable[Frame]
        if isinstance(step, Visible):
            shown = events.visible(step)
        elif isinstance(step, ToolsStarted):
            shown = events.started(step)
        elif isinstance(step, ToolsRan):
            shown = events.ran(step)
        else:
            shown = events.finished(step)
        frames += shown
    payloads = [dict(payload) for _, payload in frames]
    assert [name for name, _ in frames] == [p["type"] for p in payloads]
    for payload in payloads:
        EVENTS.validate_python(payload)
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    return payloads


def kinds(payloads: list[dict[str, Any]]) -> list[str]:
    return [p["type"].removeprefix("response.") for p in payloads]


LIST_EVENTS = ["output_item.added", "mcp_list_tools.in_progress", "mcp_list_tools.completed", "output_item.done"]
CALL_STARTS = ["output_item.added", "mcp_call.in_progress", "mcp_call_arguments.delta", "mcp_call_arguments.done"]
MESSAGE_EVENTS = ["output_item.added", "content_part.added", "output_text.delta", "output_item.done"]


@pytest.mark.parametrize(("outcome", "error"), outcomes())
async def test_a_stream_shows_the_list_then_the_call_as_it_runs_in_openais_order(
        outcome: ToolOutcome, error: dict[str, Any] | None) -> None:
    runs = (outcome, ok("call_2", "add", "3"))
    payloads = streamed(ResponseEvents(await plan(True), SHOWN), *opening(), *reasoning_pieces(),
                        ToolsStarted(0, CALLING.calls, CALLING), ToolsRan(0, CALLING.calls, runs, CALLING),
                        *answer_pieces(1), finished(outcome, rid="resp_1"))
    ended = "mcp_call.completed" if error is None else "mcp_call.failed"
    assert kinds(payloads) == ["created", "in_progress", *LIST_EVENTS, "output_item.added", "output_item.done",
                               *CALL_STARTS, ended, "output_item.done", *MESSAGE_EVENTS, "completed"]
    # the list first, then the round's reasoning and its call at its place, then the answer: each
    # frame's index is that of its item in the final response
    final = payloads[-1]["response"]
    assert [p["output_index"] for p in payloads if "output_index" in p] == [0] * 4 + [1] * 2 + [2] * 6 + [3] * 4
    assert [item["type"] for item in final["output"]] == ["mcp_list_tools", "reasoning", "mcp_call", "message"]
    assert payloads[0]["response"]["id"] == payloads[-1]["response"]["id"] == "resp_1"
    added, arguments, done = payloads[8], payloads[10], payloads[13]
    assert (added["item"]["arguments"], added["item"]["status"], added["item"]["output"]) == ("", "in_progress", None)
    assert (arguments["delta"], arguments["item_id"]) == (ARGUMENTS, "mcp_call_1")
    assert done["item"] == final["output"][2]
    assert ITEMS.validate_python(done["item"]).model_dump(exclude_none=True)["status"] == (
        "completed" if error is None else "failed")
    assert payloads[5]["item"] == LISTED
    assert payloads[2]["item"]["tools"] == []


async def test_a_listing_that_failed_shows_failed_with_its_error() -> None:
    failed = {**LISTED, "tools": [], "error": "MCP server 'docs' is unavailable"}
    shown = McpShown(SHOWN.by_name, lists=(failed,))
    payloads = streamed(ResponseEvents(await plan(True), shown), *opening(), *answer_pieces(0),
                        Finished((ANSWER,), (), "stop", False, "resp_2"))
    assert kinds(payloads)[2:6] == ["output_item.added", "mcp_list_tools.in_progress", "mcp_list_tools.failed",
                                    "output_item.done"]
    assert payloads[5]["item"]["error"] == "MCP server 'docs' is unavailable"


async def test_a_call_that_may_ask_for_approval_shows_once_it_ran() -> None:
    """A call the client may have to approve is not shown as it starts: paused, it becomes an
    approval request; run (approved), it shows whole once it ran."""
    shown = McpShown(SHOWN.by_name, lists=SHOWN.lists, asks=frozenset({DECLARED}), approvals={"call_1": "mcpr_call_1"})
    paused = ToolOutcome("call_1", DECLARED, "interrupted", "waiting for the client's approval")
    events = ResponseEvents(await plan(True), shown)
    assert list(events.started(ToolsStarted(0, CALLING.calls[:1], CALLING))) == []
    assert list(events.ran(ToolsRan(0, CALLING.calls[:1], (paused,), CALLING))) == []
    mine = CALLING.calls[:1]
    payloads = streamed(ResponseEvents(await plan(True), shown), *opening(), ToolsStarted(0, mine, CALLING),
                        ToolsRan(0, mine, (ok("call_1", DECLARED),), CALLING), *answer_pieces(1),
                        finished(ok("call_1", DECLARED)))
    assert kinds(payloads)[2:12] == [*LIST_EVENTS, *CALL_STARTS, "mcp_call.completed", "output_item.done"]
    assert payloads[11]["item"]["approval_request_id"] == "mcpr_call_1"


async def test_an_approval_request_comes_whole_added_then_done() -> None:
    request = approval_item("mcpr_call_1", "docs", "read_file", ARGUMENTS)
    paused = ToolOutcome("call_1", DECLARED, "interrupted", "waiting for the client's approval")
    shown = McpShown(SHOWN.by_name, lists=SHOWN.lists, asks=frozenset({DECLARED}))
    done = finished(paused, (request,))
    payloads = streamed(ResponseEvents(await plan(True), shown), *opening(), *reasoning_pieces(), done)
    assert kinds(payloads) == ["created", "in_progress", *LIST_EVENTS, "output_item.added", "output_item.done",
                               "output_item.added", "output_item.done", "completed"]
    assert payloads[8]["item"] == payloads[9]["item"] == request
    assert payloads[8]["output_index"] == payloads[9]["output_index"] == 2
    answer = Response.model_validate(final_response(await plan(False), done, shown))
    listed, reasoned, asked = answer.output  # the paused call: no mcp_call, its request instead
    assert isinstance(listed, McpListTools)
    assert reasoned.type == "reasoning"
    assert isinstance(asked, McpApprovalRequest)
    assert asked.model_dump() == request
    assert json.loads(asked.arguments) == {"path": "notes.txt"}
