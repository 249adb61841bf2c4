"""What a user debugging failed parses sees in Arize Phoenix (issue 57): the real Phoenix from PyPI
(tests/e2e/phoenix.py) receives the gateway's spans over OTLP/HTTP at the `/v1/traces` URL it
advertises, after one trajectory with a renamed argument rejected twice and then corrected, a call
of the client's own tool rejected by the gateway's check, and a call a reviewer approved. Read back
through Phoenix's GraphQL API (what its pages show): the requests are AGENT spans with their input,
output and counts, the rejected calls TOOL spans with their arguments, diagnostic and reason, each
retry names the call it retried, the filters docs/phoenix.md gives find what they say and nothing
else, and the trajectory is one session. Then Phoenix's trace view, in the headless Chromium."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, expect

from gateway.demo.model import Reply
from gateway.tools import Param, Tool, ToolRegistry
from telemetry import names
from tests.conftest import (
    PAID,
    USER,
    Stack,
    StackFactory,
    decide,
    first_pending,
    pay,
    sample_registry,
    while_asking,
)
from tests.e2e.phoenix import Phoenix, Span

TRAJECTORY = "phoenix-trajectory-1"
PROJECT = "toolspan"  # named by the resource attribute openinference.project.name
DOCS = Path(__file__).resolve().parents[2] / "docs" / "phoenix.md"
# The filters docs/phoenix.md gives, in Phoenix's filter language.
FAILED_PARSES = "span_kind == 'TOOL' and toolspan.outcome == 'rejected'"
REQUESTS_WITH_FAILED_PARSES = "span_kind == 'AGENT' and toolspan.tool_calls.rejected > 0"
ONE_REASON = "toolspan.rejection.reason == 'missing_arguments'"
FAILED_CALLS = "span_kind == 'TOOL' and status_code == 'ERROR'"
RETRIES = "toolspan.retry.kind is not None"
STUCK_RETRIES = "toolspan.retry.kind == 'verbatim'"
FAILED_AGAIN = "toolspan.retry.kind is not None and toolspan.outcome != 'ok'"
NESTED = "attributes['toolspan']['outcome'] == 'rejected'"
# What the docs warn against: a dotted name as one key finds nothing (Phoenix nests the parts).
ONE_KEY = "attributes['toolspan.outcome'] == 'rejected'"

OPEN_FILE = {"type": "function", "function": {
    "name": "open_file", "description": "Open a file of the project",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
RENAMED = {"file_path": "/etc/motd"}
CORRECTED = {"path": "/etc/motd"}


def registry() -> ToolRegistry:
    tools = sample_registry()
    tools.register(Tool(name="pay", description="Pay someone", function=pay, approval=True,
                        parameters=[Param("to", "string", required=True), Param("amount", "number", required=True)]))
    return tools


async def chat(stack: Stack, **request: Any) -> tuple[str, str | None]:
    """One request of the trajectory through the official openai client: its trace id and answer."""
    body: dict[str, Any] = {"model": "test-model", "messages": USER, **request}
    raw = await stack.client.chat.completions.with_raw_response.create(
        **body, extra_headers={"X-Trajectory-Id": TRAJECTORY})
    return raw.headers["x-trace-id"], raw.parse().choices[0].message.content


async def run_trajectory(stack: Stack) -> list[str]:
    """The three requests; their trace ids."""
    stack.script.then(Reply(tool_calls=[("read_file", RENAMED)]),  # rejected
                      Reply(tool_calls=[("read_file", RENAMED)]),  # its verbatim retry, rejected: stuck
                      Reply(tool_calls=[("read_file", CORRECTED)]),  # the corrected retry
                      Reply(content="It says hello."))
    first, answer = await chat(stack)
    assert answer == "It says hello."
    stack.script.then(Reply(tool_calls=[("open_file", {"file_path": "notes.txt"})]),  # the gateway's check rejects it
                      Reply(tool_calls=[("open_file", {"path": "notes.txt"})]))  # corrected: the client gets it
    second, _ = await chat(stack, tools=[OPEN_FILE])
    PAID.clear()
    stack.script.then(Reply(tool_calls=[("pay", {"to": "ACME", "amount": 12.5})]), Reply(content="Paid."))

    async def reviewer() -> None:
        approval = await first_pending(stack)
        assert (await decide(stack, approval["id"], decision="approve"))[0] == 200

    third, answer = await while_asking(lambda: chat(stack), reviewer)
    assert (answer, PAID) == ("Paid.", [{"to": "ACME", "amount": 12.5}])
    return [first, second, third]


async def exported(stack: Stack, phoenix: Phoenix) -> list[Span]:
    """Every span the gateway ended, once Phoenix has them all."""
    provider = stack.observability.provider
    assert provider is not None
    assert provider.force_flush()
    sent = {format(s.context.span_id, "016x") for s in stack.spans()}

    async def arrived() -> list[Span]:
        found = await phoenix.spans(PROJECT)
        return found if sent <= {s.span_id for s in found} else []

    found: list[Span] = await phoenix.until(arrived, f"the {len(sent)} spans of the trajectory")
    return found


def tool_calls(spans: list[Span]) -> list[Span]:
    return [s for s in spans if s.name == names.SPAN_TOOL_CALL]


def first_line(text: str) -> str:
    return text.split("\n", 1)[0]


def assert_request(span: Span, counts: dict[str, int]) -> None:
    """An AGENT span with the trajectory as its session, its input and output, and these counts."""
    assert span.kind == names.SPAN_KIND_AGENT
    assert span.attribute(names.ATTR_OPERATION_NAME) == names.OPERATION_INVOKE_AGENT
    assert span.attribute(names.ATTR_REQUEST_MODEL) == "test-model"
    assert span.attribute(names.ATTR_SESSION_ID) == span.attribute(names.ATTR_CONVERSATION_ID) == TRAJECTORY
    assert span.status != "ERROR"  # it recovered: the counts say what happened
    assert USER[0]["content"] in json.dumps(json.loads(span.input or "null"))
    assert json.loads(span.output or "null")
    tool_counts = span.attribute(names.ATTR_TOOL_CALLS_PREFIX.rstrip("."))  # nested: one key per count
    assert isinstance(tool_counts, dict)
    assert {k: v for k, v in tool_counts.items() if v} == counts


def assert_rejected(span: Span, arguments: dict[str, Any], side: str) -> None:
    """A TOOL span with the call's arguments, the diagnostic the model got, and the reason."""
    assert span.kind == names.SPAN_KIND_TOOL
    assert span.attribute(names.ATTR_OI_TOOL_NAME) == span.attribute(names.ATTR_TOOL_NAME)
    assert span.attribute(names.ATTR_TOOL_SIDE) == side
    assert span.attribute(names.ATTR_OUTCOME) == "rejected"
    assert span.attribute(names.ATTR_REJECTION_REASON) == "missing_arguments"
    assert json.loads(span.input or "null") == arguments == json.loads(span.attribute(names.ATTR_TOOL_CALL_ARGUMENTS))
    assert span.output is not None
    assert span.output == span.attribute(names.ATTR_TOOL_CALL_RESULT)
    assert "did you mean 'path'?" in span.output
    assert "\n" in span.output  # its line breaks kept
    assert span.status == "ERROR"
    assert first_line(span.status_message).startswith("missing_arguments: ")
    assert span.status_message.split("\n")[1] == ""  # then a blank line, then the diagnostic
    assert span.output in span.status_message


def assert_retry(span: Span, retried: Span, kind: str, outcome: str) -> None:
    assert span.kind == names.SPAN_KIND_TOOL
    assert (span.attribute(names.ATTR_RETRY_KIND), span.attribute(names.ATTR_OUTCOME)) == (kind, outcome)
    assert span.attribute(names.ATTR_RETRY_OF_SPAN_ID) == retried.span_id
    assert span.attribute(names.ATTR_RETRY_OF_TRACE_ID) == retried.trace_id
    assert span.input is not None  # a retry's arguments are always kept


async def ids_found(phoenix: Phoenix, condition: str) -> set[str]:
    return {s.span_id for s in await phoenix.spans(PROJECT, condition)}


def test_the_docs_give_the_filters_checked_here() -> None:
    page = DOCS.read_text(encoding="utf-8")
    for condition in (FAILED_PARSES, REQUESTS_WITH_FAILED_PARSES, ONE_REASON, FAILED_CALLS, RETRIES, STUCK_RETRIES,
                      FAILED_AGAIN):
        assert f"| `{condition}` |" in page, condition
    for accessor in ("attributes['toolspan']['outcome']", "attributes['toolspan.outcome']"):
        assert f"`{accessor}`" in page


async def test_a_trajectory_read_back_from_phoenix(make_stack: StackFactory, phoenix: Phoenix, browser: Browser,
                                                    clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    stack = await make_stack(registry=registry(), otel_exporter_otlp_endpoint=phoenix.traces_url,
                             otel_resource_attributes=f"openinference.project.name={PROJECT}",
                             capture_message_content=True, client_tool_check="reject")
    traces = await run_trajectory(stack)
    spans = await exported(stack, phoenix)

    requests = [s for s in spans if s.name == "POST /v1/chat/completions"]
    assert [s.trace_id for s in requests] == traces
    assert_request(requests[0], {"ok": 1, "rejected": 2, "total": 3, "retried": 2, "recovered": 1})
    assert_request(requests[1], {"ok": 1, "rejected": 1, "total": 2, "retried": 1, "recovered": 1})
    assert_request(requests[2], {"ok": 1, "total": 1})
    assert "It says hello." in (requests[0].output or "")
    assert {s.kind for s in spans if s.name.startswith(names.SPAN_CHAT_PREFIX + " ")} == {names.SPAN_KIND_LLM}

    rejected, verbatim, corrected = [s for s in tool_calls(spans) if s.trace_id == traces[0]]
    for span in (rejected, verbatim):
        assert_rejected(span, RENAMED, names.SIDE_GATEWAY)
        # The tool's JSON Schema, which Phoenix keeps parsed.
        assert span.attribute(names.ATTR_OI_TOOL_PARAMETERS)["required"] == ["path"]
    assert_retry(verbatim, rejected, "verbatim", "rejected")
    assert_retry(corrected, verbatim, "corrected", "ok")
    client_rejected, client_corrected = [s for s in tool_calls(spans) if s.trace_id == traces[1]]
    assert_rejected(client_rejected, {"file_path": "notes.txt"}, names.SIDE_CLIENT)
    assert_retry(client_corrected, client_rejected, "corrected", "ok")
    [approved] = [s for s in tool_calls(spans) if s.trace_id == traces[2]]
    assert (approved.kind, approved.attribute(names.ATTR_TOOL_DECISION)) == (names.SPAN_KIND_TOOL, "approve")
    assert (approved.input, approved.output) == (None, None)  # a first try that ran: record_tool_arguments is off

    failed_parses = {rejected.span_id, verbatim.span_id, client_rejected.span_id}
    for condition in (FAILED_PARSES, ONE_REASON, FAILED_CALLS, NESTED):
        assert await ids_found(phoenix, condition) == failed_parses, condition
    assert await ids_found(phoenix, REQUESTS_WITH_FAILED_PARSES) == {requests[0].span_id, requests[1].span_id}
    assert await ids_found(phoenix, RETRIES) == {verbatim.span_id, corrected.span_id, client_corrected.span_id}
    assert await ids_found(phoenix, STUCK_RETRIES) == await ids_found(phoenix, FAILED_AGAIN) == {verbatim.span_id}
    assert await ids_found(phoenix, ONE_KEY) == set()
    assert await phoenix.session_traces(TRAJECTORY) == set(traces)

    await screenshot(browser, phoenix, rejected, tmp_path / "phoenix-trace.png")


async def screenshot(browser: Browser, phoenix: Phoenix, span: Span, path: Path) -> None:
    """Phoenix's trace view of `span`'s trace with it selected, once drawn, saved as a PNG."""
    context = await browser.new_context(viewport={"width": 1600, "height": 1000})
    page = await context.new_page()
    await page.goto(f"{phoenix.url}/redirects/spans/{span.span_id}")
    await expect(page.get_by_text(first_line(span.status_message)).first).to_be_visible(timeout=20_000)
    png = await page.screenshot(path=str(path))  # the bytes written there
    await context.close()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(png) > 10_000
