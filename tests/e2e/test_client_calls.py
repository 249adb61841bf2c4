"""The model's calls of the client's own tools, checked against the schemas the request declares
(issue 36), through the official openai client, both APIs, streamed and not: a renamed argument is
counted as a rejection on the client's side with its did-you-mean on the span while the client
gets the call as the model sent it; the corrected call in the next request is a corrected retry of
it; in reject mode the gateway answers the model itself and the client only sees the corrected call."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from opentelemetry.sdk.trace import ReadableSpan

from gateway.demo.model import Reply
from telemetry import names
from tests.conftest import (
    AUTH,
    STREAM,
    TEST_KEY,
    USER,
    Stack,
    StackFactory,
    call_args,
    tool_call_spans,
    toolspan_cli,
)

PARAMETERS = {"type": "object", "properties": {"path": {"type": "string"}, "lines": {"type": "integer"}},
              "required": ["path"]}
CHAT_TOOL = {"type": "function", "function": {"name": "open_file", "description": "Open a file of the project",
                                              "parameters": PARAMETERS}}
RESPONSES_TOOL = {"type": "function", "name": "open_file", "description": "Open a file of the project",
                  "parameters": PARAMETERS}
RENAMED = {"file_path": "notes.txt"}  # the model's first try: `path` under another name
CORRECTED = {"path": "notes.txt"}


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def client_metric(stack: Stack, metric: str, **labels: str) -> float:
    return stack.metric(metric, side=names.SIDE_CLIENT, **labels)


def assert_renamed_call_rejected(stack: Stack, span: ReadableSpan) -> None:
    """The span and the counts of the client call that sent `file_path` for `path`."""
    found = attributes(span)
    assert found[names.ATTR_TOOL_SIDE] == names.SIDE_CLIENT
    assert found[names.ATTR_TOOL_NAME] == "open_file"
    assert found[names.ATTR_OUTCOME] == "rejected"
    assert found[names.ATTR_REJECTION_REASON] == "missing_arguments"
    assert found[names.ATTR_ARGS_MISSING] == ("path",)
    assert found[names.ATTR_ARGS_UNRECOGNIZED] == ("file_path",)
    assert found[names.ATTR_ARGS_SUGGESTIONS] == ("file_path->path",)  # the did-you-mean
    assert json.loads(found[names.ATTR_TOOL_CALL_ARGUMENTS]) == RENAMED
    assert span.status.description is not None
    assert "Unrecognized: file_path (did you mean 'path'?)" in span.status.description
    assert "Accepted parameters: path, lines" in span.status.description
    assert [child.name for child in stack.spans(f"{span.context.trace_id:032x}")
            if child.parent is not None and child.parent.span_id == span.context.span_id] == [names.SPAN_TOOL_PARSE]
    assert client_metric(stack, names.METRIC_TOOL_CALLS, tool="open_file", outcome="rejected") == 1
    assert client_metric(stack, names.METRIC_TOOL_REJECTIONS, tool="open_file", reason="missing_arguments") == 1
    assert stack.metric(names.METRIC_TOOL_CALLS, side=names.SIDE_GATEWAY) == 0


def assert_corrected_retry(stack: Stack, first: ReadableSpan, second: ReadableSpan) -> None:
    found = attributes(second)
    assert found[names.ATTR_OUTCOME] == "ok"
    assert found[names.ATTR_RETRY_KIND] == "corrected"
    [link] = second.links
    assert link.context.span_id == first.context.span_id
    assert client_metric(stack, names.METRIC_TOOL_CALLS, tool="open_file", outcome="ok") == 1
    assert client_metric(stack, names.METRIC_TOOL_RETRIES, tool="open_file", kind="corrected") == 1
    assert client_metric(stack, names.METRIC_TOOL_RECOVERIES, tool="open_file", kind="corrected") == 1


@STREAM
async def test_chat_a_renamed_argument_is_a_client_rejection_and_the_corrected_call_its_retry(
        stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(tool_calls=[("open_file", RENAMED)]), Reply(tool_calls=[("open_file", CORRECTED)]))
    first = await stack.ask(stream, messages=USER, tools=[CHAT_TOOL])
    [call] = first.tool_calls
    assert call["function"]["name"] == "open_file"
    assert call_args(call) == RENAMED
    [rejected] = tool_call_spans(stack, first.headers["x-trace-id"], side=names.SIDE_CLIENT)
    assert_renamed_call_rejected(stack, rejected)

    follow_up = [*USER, {"role": "assistant", "content": None, "tool_calls": first.tool_calls},
                 {"role": "tool", "tool_call_id": call["id"], "content": "error: no argument named path"}]
    second = await stack.ask(stream, messages=follow_up, tools=[CHAT_TOOL])
    assert second.headers["x-trajectory-id"] == first.headers["x-trajectory-id"]  # one agent run
    [fixed] = second.tool_calls
    assert call_args(fixed) == CORRECTED
    [ok] = tool_call_spans(stack, second.headers["x-trace-id"], side=names.SIDE_CLIENT)
    assert_corrected_retry(stack, rejected, ok)


@STREAM
async def test_responses_a_renamed_argument_is_a_client_rejection_and_the_corrected_call_its_retry(
        stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(tool_calls=[("open_file", RENAMED)]), Reply(tool_calls=[("open_file", CORRECTED)]))
    first = await stack.respond(stream, input="open my notes", tools=[RESPONSES_TOOL])
    [call] = first.calls
    assert call["name"] == "open_file"
    assert json.loads(call["arguments"]) == RENAMED
    [rejected] = tool_call_spans(stack, first.headers["x-trace-id"], side=names.SIDE_CLIENT)
    assert_renamed_call_rejected(stack, rejected)

    second = await stack.respond(stream, previous_response_id=first.id, tools=[RESPONSES_TOOL], input=[
        {"type": "function_call_output", "call_id": call["call_id"], "output": "error: no argument named path"}])
    assert second.headers["x-trajectory-id"] == first.headers["x-trajectory-id"]
    [fixed] = second.calls
    assert json.loads(fixed["arguments"]) == CORRECTED
    [ok] = tool_call_spans(stack, second.headers["x-trace-id"], side=names.SIDE_CLIENT)
    assert_corrected_retry(stack, rejected, ok)


@pytest.mark.parametrize("api", ["chat", "responses"])
@STREAM
async def test_reject_mode_answers_the_model_itself_and_the_client_gets_the_corrected_call(
        make_stack: StackFactory, api: str, stream: bool) -> None:
    stack = await make_stack(client_tool_check="reject")
    stack.script.then(Reply(content="Opening it.", tool_calls=[("open_file", RENAMED)]),
                      Reply(tool_calls=[("open_file", CORRECTED)]))
    if api == "chat":
        answer = await stack.ask(stream, messages=USER, tools=[CHAT_TOOL])
        [call] = answer.tool_calls
        arguments, trace_id = call_args(call), answer.headers["x-trace-id"]
    else:
        response = await stack.respond(stream, input="open my notes", tools=[RESPONSES_TOOL])
        [item] = response.calls
        arguments, trace_id = json.loads(item["arguments"]), response.headers["x-trace-id"]
    assert arguments == CORRECTED  # the invalid call never reached the client
    _first, second = stack.upstream_requests  # one request of the client, two rounds
    told = [m["content"] for m in second["messages"] if m.get("role") == "tool"] if api == "chat" else [
        i["output"] for i in second["input"] if i.get("type") == "function_call_output"]
    [diagnostic] = told
    assert "Missing: path" in diagnostic
    assert "Unrecognized: file_path (did you mean 'path'?)" in diagnostic
    rejected, ok = tool_call_spans(stack, trace_id, side=names.SIDE_CLIENT)
    assert attributes(rejected)[names.ATTR_OUTCOME] == "rejected"
    assert attributes(ok)[names.ATTR_OUTCOME] == "ok"
    assert attributes(ok)[names.ATTR_RETRY_KIND] == "corrected"
    assert tool_call_spans(stack, trace_id) == []  # the gateway ran none of its own tools


@STREAM
async def test_reject_mode_holds_what_it_answered_when_another_client_call_goes_to_the_client(
        make_stack: StackFactory, stream: bool) -> None:
    stack = await make_stack(client_tool_check="reject")
    stack.script.then(Reply(tool_calls=[("open_file", RENAMED), ("open_file", {"path": "todo.txt"})]),
                      Reply(content="Both read."))
    first = await stack.ask(stream, messages=USER, tools=[CHAT_TOOL])
    [call] = first.tool_calls
    assert call_args(call) == {"path": "todo.txt"}
    follow_up = [*USER, {"role": "assistant", "content": None, "tool_calls": first.tool_calls},
                 {"role": "tool", "tool_call_id": call["id"], "content": "the todo list"}]
    second = await stack.ask(stream, messages=follow_up, tools=[CHAT_TOOL])
    assert second.content == "Both read."
    restored = stack.upstream_requests[1]["messages"]
    assert [call_args(c) for c in restored[1]["tool_calls"]] == [RENAMED, {"path": "todo.txt"}]
    results = [m["content"] for m in restored[2:]]
    assert "Missing: path" in results[0]
    assert results[1] == "the todo list"


async def test_the_store_report_and_page_mark_client_calls(stack: Stack) -> None:
    stack.script.then(Reply(tool_calls=[("open_file", RENAMED)]))
    answer = await stack.ask(False, messages=USER, tools=[CHAT_TOOL])
    await stack.store.flushed()
    reader = stack.observability.trajectory_reader()
    assert reader is not None
    trajectory = reader.trajectory(answer.headers["x-trajectory-id"], None)
    assert trajectory is not None
    [event] = [e for r in trajectory["requests"] for e in r["events"] if e["type"] == "tool_call"]
    assert (event["tool"], event["side"], event["outcome"], event["rejection_reason"]) == (
        "open_file", "client", "rejected", "missing_arguments")
    [tool] = reader.report(None)["tools"]
    assert (tool["tool"], tool["side"], tool["rejections"]) == ("open_file", "client", 1)
    page = await stack.http.get(f"/ui/trajectories/{answer.headers['x-trajectory-id']}", headers=AUTH)
    assert 'data-side="client"' in await page.text()


async def test_off_checks_nothing(make_stack: StackFactory) -> None:
    stack = await make_stack(client_tool_check="off")
    stack.script.then(Reply(tool_calls=[("open_file", RENAMED)]))
    answer = await stack.ask(False, messages=USER, tools=[CHAT_TOOL])
    assert call_args(answer.tool_calls[0]) == RENAMED
    assert tool_call_spans(stack, answer.headers["x-trace-id"], side=names.SIDE_CLIENT) == []
    assert stack.metric(names.METRIC_TOOL_CALLS) == 0


async def test_a_keys_own_client_tool_check_wins_over_the_gateways(make_stack: StackFactory) -> None:
    """The gateway observes; one key's requests are enforced, another key's only observed."""
    stack = await make_stack(keys={"strict": {"key": TEST_KEY, "client_tool_check": "reject"},
                                   "lenient": {"key": "tsk-lenient-00"}})
    stack.script.then(Reply(tool_calls=[("open_file", RENAMED)]), Reply(tool_calls=[("open_file", CORRECTED)]),
                      Reply(tool_calls=[("open_file", RENAMED)]))
    enforced = await stack.ask(False, messages=USER, tools=[CHAT_TOOL])  # the stack's client sends TEST_KEY
    assert call_args(enforced.tool_calls[0]) == CORRECTED
    async with openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key="tsk-lenient-00", max_retries=0) as lenient:
        observed = await lenient.chat.completions.create(model="test-model", messages=USER, tools=[CHAT_TOOL])
    [call] = observed.choices[0].message.tool_calls or []
    assert json.loads(call.function.arguments) == RENAMED
    assert len(stack.upstream_requests) == 3
    assert client_metric(stack, names.METRIC_TOOL_CALLS, outcome="rejected") == 2


async def test_a_call_whose_schema_is_too_large_is_counted_unchecked(stack: Stack) -> None:
    huge = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 100}
                                             for i in range(700)}}  # about 80 KB of JSON, over 64 KiB
    tool = {"type": "function", "function": {"name": "open_file", "parameters": huge}}
    stack.script.then(Reply(tool_calls=[("open_file", RENAMED)]))
    answer = await stack.ask(False, messages=USER, tools=[tool])
    assert call_args(answer.tool_calls[0]) == RENAMED
    [span] = tool_call_spans(stack, answer.headers["x-trace-id"], side=names.SIDE_CLIENT)
    assert attributes(span)[names.ATTR_OUTCOME] == "unchecked"
    assert attributes(span)[names.ATTR_UNCHECKED_REASON] == "schema_too_large"
    assert client_metric(stack, names.METRIC_TOOL_CALLS, outcome="unchecked") == 1


def execute_steps(stack: Stack, trace_id: str) -> list[ReadableSpan]:
    return [s for s in stack.spans(trace_id) if s.name == names.SPAN_TOOL_EXECUTE
            and attributes(s).get(names.ATTR_TOOL_SIDE) == names.SIDE_CLIENT]


async def handed_and_answered(stack: Stack, api: str, stream: bool, result: str) -> tuple[str, Any, Any]:
    """A client call handed over, then the request that brings `result` for it: (call id, first, second)."""
    if api == "chat":
        first = await stack.ask(stream, messages=USER, tools=[CHAT_TOOL])
        [call] = first.tool_calls
        follow_up = [*USER, {"role": "assistant", "content": None, "tool_calls": first.tool_calls},
                     {"role": "tool", "tool_call_id": call["id"], "content": result}]
        return call["id"], first, await stack.ask(stream, messages=follow_up, tools=[CHAT_TOOL])
    response = await stack.respond(stream, input="open my notes", tools=[RESPONSES_TOOL])
    [item] = response.calls
    second = await stack.respond(stream, previous_response_id=response.id, tools=[RESPONSES_TOOL], input=[
        {"type": "function_call_output", "call_id": item["call_id"], "output": result}])
    return item["call_id"], response, second


@pytest.mark.parametrize("api", ["chat", "responses"])
@STREAM
async def test_the_result_of_a_client_call_records_the_clients_execute_step(stack: Stack, api: str,
                                                                             stream: bool) -> None:
    stack.script.then(Reply(tool_calls=[("open_file", CORRECTED)]), Reply(content="It says hello."))
    call_id, first, second = await handed_and_answered(stack, api, stream, "hello from the notes")
    assert execute_steps(stack, first.headers["x-trace-id"]) == []
    [step] = execute_steps(stack, second.headers["x-trace-id"])
    found = attributes(step)
    assert (found[names.ATTR_TOOL_NAME], found[names.ATTR_TOOL_CALL_ID], found[names.ATTR_OUTCOME]) == (
        "open_file", call_id, names.OUTCOME_RETURNED)
    assert found[names.ATTR_RESULT_BYTES] == len("hello from the notes")
    assert found[names.ATTR_CONVERSATION_ID] == first.headers["x-trajectory-id"]
    [answered] = [s for s in stack.spans(first.headers["x-trace-id"]) if s.parent is None]
    [asked] = [s for s in stack.spans(second.headers["x-trace-id"]) if s.parent is None]
    assert step.parent is not None
    assert step.parent.span_id == asked.context.span_id
    # From the first answer to the request that brought the result: the client's side of the call.
    assert answered.start_time is not None
    assert step.start_time is not None
    assert asked.start_time is not None
    assert answered.start_time <= step.start_time <= asked.start_time
    assert stack.metric(names.METRIC_CLIENT_TOOL_ROUNDTRIP + "_count", tool="open_file",
                        outcome=names.OUTCOME_RETURNED) == 1


async def test_a_result_sent_again_is_reported_once(stack: Stack) -> None:
    stack.script.then(Reply(tool_calls=[("open_file", CORRECTED)]), Reply(content="It says hello."),
                      Reply(content="Still hello."))
    _, _, second = await handed_and_answered(stack, "chat", False, "hello")
    history = [*stack.upstream_requests[1]["messages"], {"role": "assistant", "content": second.content},
               {"role": "user", "content": "and again?"}]
    third = await stack.ask(False, messages=history, tools=[CHAT_TOOL])
    assert execute_steps(stack, third.headers["x-trace-id"]) == []
    assert stack.metric(names.METRIC_CLIENT_TOOL_ROUNDTRIP + "_count") == 1


async def test_the_operators_rule_says_which_results_are_failures(make_stack: StackFactory) -> None:
    stack = await make_stack(client_tool_error_prefix="error:")
    stack.script.then(Reply(tool_calls=[("open_file", CORRECTED)]), Reply(content="It is missing."))
    _, _, second = await handed_and_answered(stack, "chat", False, "error: no such file")
    [step] = execute_steps(stack, second.headers["x-trace-id"])
    assert attributes(step)[names.ATTR_OUTCOME] == "error"
    assert step.status.description == "the client's tool said the call failed"
    assert stack.metric(names.METRIC_CLIENT_TOOL_ROUNDTRIP + "_count", outcome="error") == 1


async def test_the_clients_execute_step_completes_its_calls_row_in_the_store(stack: Stack) -> None:
    stack.script.then(Reply(tool_calls=[("open_file", CORRECTED)]), Reply(content="It says hello."))
    _, first, second = await handed_and_answered(stack, "chat", False, "hello from the notes")
    await stack.store.flushed()
    reader = stack.observability.trajectory_reader()
    assert reader is not None
    trajectory = reader.trajectory(first.headers["x-trajectory-id"], None)
    assert trajectory is not None
    [event] = [e for r in trajectory["requests"] for e in r["events"] if e["type"] == "tool_call"]
    [step] = execute_steps(stack, second.headers["x-trace-id"])
    assert step.start_time is not None
    assert step.end_time is not None
    assert event["client_ms"] == pytest.approx((step.end_time - step.start_time) / 1e6)
    assert (event["side"], event["result_bytes"], event["result_outcome"]) == (
        "client", len("hello from the notes"), names.OUTCOME_RETURNED)
    page = await stack.http.get(f"/ui/trajectories/{first.headers['x-trajectory-id']}", headers=AUTH)
    assert "result returned, 20 bytes" in await page.text()
    shown = await toolspan_cli("trajectories", "show", first.headers["x-trajectory-id"], "--db", str(stack.store.path))
    assert "client tool call open_file: ok" in shown
    assert "[result returned, 20 bytes," in shown
