"""What trace tools find of a run (issue 57), through the official openai client: the request as an
agent's run (invoke_agent, OpenInference AGENT) with its tool calls counted, its input and output
only with message capture; a tool.call as a TOOL span with its arguments, its diagnostic, a status
whose first line says why, and a retry naming the call it retries; the decisions as OTLP log
records in the trace and span of their call, sent to a real OTLP/HTTP endpoint."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from gateway.demo.model import Reply
from telemetry import names
from tests.conftest import (
    AUTH,
    STREAM,
    USER,
    Stack,
    StackFactory,
    approval_registry,
    decide,
    first_pending,
    tool_call_spans,
    while_asking,
)
from tests.e2e.otlp import Receiver, attrs

RENAMED = {"file_path": "notes.txt"}  # read_file's `path` under another name
CORRECTED = {"path": "notes.txt"}
COUNT = names.ATTR_TOOL_CALLS_PREFIX


def request_span(stack: Stack, trace_id: str) -> ReadableSpan:
    [span] = [s for s in stack.spans(trace_id) if s.parent is None]
    return span


def recovering(stack: Stack) -> None:
    """A renamed argument, its corrected retry, and the answer."""
    stack.script.then(Reply(tool_calls=[("read_file", RENAMED)]), Reply(tool_calls=[("read_file", CORRECTED)]),
                      Reply(content="The notes say hello."))


@STREAM
async def test_a_request_that_recovered_is_an_ok_agent_span_its_tool_calls_counted(make_stack: StackFactory,
                                                                                   stream: bool) -> None:
    stack = await make_stack()
    recovering(stack)
    answer = await stack.ask(stream, messages=USER, extra_headers={"X-Trajectory-Id": "run-1"})
    trace_id = answer.headers["x-trace-id"]
    span = request_span(stack, trace_id)
    found = dict(span.attributes or {})
    assert (found[names.ATTR_OPERATION_NAME], found[names.ATTR_OPENINFERENCE_SPAN_KIND]) == ("invoke_agent", "AGENT")
    assert found[names.ATTR_REQUEST_MODEL] == "test-model"
    assert found[names.ATTR_CONVERSATION_ID] == found[names.ATTR_SESSION_ID] == "run-1"
    counts = {key.removeprefix(COUNT): value for key, value in found.items() if key.startswith(COUNT)}
    assert counts == {"total": 2, "rejected": 1, "ok": 1, "retried": 1, "recovered": 1}
    assert span.status.status_code is StatusCode.OK  # it recovered: the counts, not the status, find it
    assert names.ATTR_INPUT_VALUE not in found
    assert names.ATTR_OUTPUT_VALUE not in found
    chats = [s for s in stack.spans(trace_id) if s.name == "chat test-model"]
    assert [(s.attributes or {})[names.ATTR_CONVERSATION_ID] for s in chats] == ["run-1"] * 3  # Langfuse's sessions
    assert {(s.attributes or {})[names.ATTR_OPENINFERENCE_SPAN_KIND] for s in chats} == {"LLM"}

    rejected, retry = tool_call_spans(stack, trace_id)
    failed = dict(rejected.attributes or {})
    assert (failed[names.ATTR_OPENINFERENCE_SPAN_KIND], failed[names.ATTR_OI_TOOL_NAME]) == ("TOOL", "read_file")
    assert json.loads(failed[names.ATTR_OI_TOOL_PARAMETERS])["required"] == ["path"]
    assert json.loads(failed[names.ATTR_INPUT_VALUE]) == json.loads(failed[names.ATTR_TOOL_CALL_ARGUMENTS]) == RENAMED
    diagnostic = failed[names.ATTR_OUTPUT_VALUE]
    assert diagnostic == failed[names.ATTR_TOOL_CALL_RESULT] == stack.upstream_requests[1]["messages"][-1]["content"]
    assert "\n" in diagnostic  # the model's message, its lines kept
    headline, rest = (rejected.status.description or "").split("\n\n", 1)
    assert headline == "missing_arguments: missing path; unrecognized file_path (did you mean path?)"
    assert rest == diagnostic

    repaired = dict(retry.attributes or {})
    assert repaired[names.ATTR_RETRY_OF_SPAN_ID] == f"{rejected.context.span_id:016x}"
    assert repaired[names.ATTR_RETRY_OF_TRACE_ID] == f"{rejected.context.trace_id:032x}"
    assert json.loads(repaired[names.ATTR_INPUT_VALUE]) == CORRECTED  # a retry's arguments, beside the failed ones
    assert names.ATTR_OUTPUT_VALUE not in repaired  # a success's result only when arguments are recorded


async def test_with_message_capture_the_agent_span_has_the_runs_input_and_final_output(
        make_stack: StackFactory) -> None:
    stack = await make_stack(capture_message_content=True)
    recovering(stack)
    answer = await stack.ask(False, messages=USER)
    found = dict(request_span(stack, answer.headers["x-trace-id"]).attributes or {})
    assert found[names.ATTR_INPUT_MIME_TYPE] == found[names.ATTR_OUTPUT_MIME_TYPE] == "application/json"
    [asked] = json.loads(found[names.ATTR_INPUT_VALUE])
    assert asked["parts"] == [{"type": "text", "content": USER[0]["content"]}]
    [said] = json.loads(found[names.ATTR_OUTPUT_VALUE])
    assert said["parts"] == [{"type": "text", "content": "The notes say hello."}]  # the last round's, not the first
    assert found[names.ATTR_INPUT_MESSAGES] == found[names.ATTR_INPUT_VALUE]
    assert found[names.ATTR_OUTPUT_MESSAGES] == found[names.ATTR_OUTPUT_VALUE]


async def test_recorded_arguments_put_every_calls_result_on_its_span(make_stack: StackFactory) -> None:
    stack = await make_stack(record_tool_arguments=True)
    stack.script.then(Reply(tool_calls=[("read_file", CORRECTED)]), Reply(content="done"))
    answer = await stack.ask(False, messages=USER)
    [call] = tool_call_spans(stack, answer.headers["x-trace-id"])
    found = dict(call.attributes or {})
    assert found[names.ATTR_TOOL_CALL_RESULT] == found[names.ATTR_OUTPUT_VALUE] == "contents of notes.txt"
    assert found[names.ATTR_OUTPUT_MIME_TYPE] == "text/plain"


async def test_a_request_that_called_no_model_is_no_agent_run(make_stack: StackFactory) -> None:
    stack = await make_stack()
    async with stack.http.post("/v1/chat/completions", json={"model": "m"}, headers=AUTH) as response:
        assert response.status == 400  # no messages: refused before any provider call
        trace_id = response.headers["x-trace-id"]
    found = dict(request_span(stack, trace_id).attributes or {})
    assert names.ATTR_OPERATION_NAME not in found
    assert names.ATTR_OPENINFERENCE_SPAN_KIND not in found


def records_of(receiver: Receiver, event: str) -> list[dict[str, Any]]:
    """The log records of one event name, each as its attributes with its ids and severity."""
    return [{**attrs(r), "trace_id": r.trace_id.hex(), "span_id": r.span_id.hex(), "severity": r.severity_text,
             "body": r.body.string_value} for r in receiver.records if r.event_name == event]


async def test_decisions_are_log_records_in_the_trace_and_span_of_their_call(
        make_stack: StackFactory, receiver: tuple[Receiver, str]) -> None:
    found, url = receiver
    # The base URL given as a trace backend advertises it: the records still go to /v1/logs.
    stack = await make_stack(registry=approval_registry(), otel_exporter_otlp_endpoint=f"{url}/v1/traces",
                             otel_logs_exporter="otlp", keepalive_seconds=0.05)
    stack.script.then(Reply(tool_calls=[("pay", {"to": "ACME"})]),  # amount missing: denied by the parse step
                      Reply(tool_calls=[("pay", {"to": "ACME", "amount": 5})]), Reply(content="Paid."))

    async def reviewer() -> None:
        approval = await first_pending(stack)
        assert (await decide(stack, approval["id"], decision="approve"))[0] == 200

    answer = await while_asking(lambda: stack.ask(False, messages=USER), reviewer)
    rejected, approved = tool_call_spans(stack, answer.headers["x-trace-id"])
    assert stack.observability.log_provider is not None
    assert await asyncio.to_thread(stack.observability.log_provider.force_flush, 10_000)

    parsed = records_of(found, names.EVENT_TOOL_PARSE)
    assert [(r[names.ATTR_DECISION], r.get(names.ATTR_REJECTION_REASON), r["severity"]) for r in parsed] == [
        ("deny", "missing_arguments", "WARN"), ("allow", None, "INFO")]
    for record, span in zip(parsed, (rejected, approved), strict=True):
        assert (record["trace_id"], record["span_id"]) == (f"{span.context.trace_id:032x}",
                                                           f"{span.context.span_id:016x}")
        assert (record[names.ATTR_TOOL_NAME], record[names.ATTR_TOOL_SIDE]) == ("pay", "gateway")
        assert record[names.ATTR_TOOL_CALL_ID] == (span.attributes or {})[names.ATTR_TOOL_CALL_ID]
    asked, decided = records_of(found, names.EVENT_TOOL_APPROVAL)
    assert (asked[names.ATTR_DECISION], decided[names.ATTR_DECISION]) == ("require_approval", "allow")
    assert asked[names.ATTR_APPROVAL_ID] == decided[names.ATTR_APPROVAL_ID] == (
        approved.attributes or {})[names.ATTR_APPROVAL_ID]
    assert decided[names.ATTR_TOOL_DECISION] == "approve"
    assert decided.get(names.ATTR_DECIDED_BY) == (approved.attributes or {}).get(names.ATTR_DECIDED_BY)
    assert {r["span_id"] for r in (asked, decided)} == {f"{approved.context.span_id:016x}"}


async def test_no_records_are_sent_unless_a_logs_exporter_is_named(make_stack: StackFactory,
                                                                    receiver: tuple[Receiver, str]) -> None:
    found, url = receiver
    stack = await make_stack(otel_exporter_otlp_endpoint=url)
    recovering(stack)
    await stack.ask(False, messages=USER)
    assert stack.observability.provider is not None
    assert await asyncio.to_thread(stack.observability.provider.force_flush, 10_000)
    await found.wait()  # the spans went
    assert stack.observability.log_provider is None
    assert found.records == []
