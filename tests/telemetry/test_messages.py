"""Message content on the chat spans (opt-in, as the OpenTelemetry GenAI conventions have it):
the messages each provider call sent, the tools it offered and the answer it got, for every API,
masked and bounded, kept by the trajectory store; and none of it when capture is off (the default)."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan

from gateway.apis.chat import CHAT
from gateway.apis.messages import MESSAGES
from gateway.apis.responses import RESPONSES
from gateway.demo.model import Reply
from telemetry import names
from telemetry.messages import MessageCapture, _longer_than, output_message
from tests.conftest import STREAM, USER, Stack, StackFactory
from tests.telemetry.conftest import attr

CONTENT = (names.ATTR_INPUT_MESSAGES, names.ATTR_OUTPUT_MESSAGES, names.ATTR_SYSTEM_INSTRUCTIONS,
           names.ATTR_TOOL_DEFINITIONS)


def _chat_spans(stack: Stack, trace_id: str) -> list[ReadableSpan]:
    spans = [s for s in stack.spans(trace_id) if s.name.startswith(names.SPAN_CHAT_PREFIX + " ")]
    return sorted(spans, key=lambda s: s.start_time or 0)


def _content(span: ReadableSpan, key: str) -> Any:
    value = attr(span, key)
    assert isinstance(value, str), f"{span.name} has no {key}"
    return json.loads(value)


def _script_two_rounds(stack: Stack) -> None:
    """A call to read_file (with a secret among its arguments), then the final answer."""
    stack.script.then(Reply(tool_calls=[("read_file", {"path": "/a", "api_key": "sk-live-123456"})]),
                      Reply(content="The file says hi."))


@STREAM
async def test_chat_spans_carry_the_messages_sent_and_the_answer(make_stack: StackFactory, stream: bool) -> None:
    stack = await make_stack(capture_message_content=True)
    _script_two_rounds(stack)
    answer = await stack.ask(stream, messages=[{"role": "system", "content": "Be brief."}, *USER])
    first, second = _chat_spans(stack, answer.headers["x-trace-id"])

    system, user = {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]}, \
        {"role": "user", "parts": [{"type": "text", "content": "hello"}]}
    assert _content(first, names.ATTR_INPUT_MESSAGES) == [system, user]
    [asked] = _content(first, names.ATTR_OUTPUT_MESSAGES)
    [call] = asked["parts"]
    assert asked["role"] == "assistant"
    assert asked["finish_reason"] == "tool_call"
    assert call["type"] == "tool_call"
    assert call["name"] == "read_file"
    assert call["arguments"] == {"path": "/a", "api_key": "[REDACTED]"}  # masked as tool arguments are

    sent = _content(second, names.ATTR_INPUT_MESSAGES)
    assert sent[:2] == [system, user]
    assert sent[2] == {"role": "assistant", "parts": [call]}
    assert sent[3] == {"role": "tool", "parts": [{"type": "tool_call_response", "id": call["id"],
                                                  "response": "contents of /a"}]}
    assert _content(second, names.ATTR_OUTPUT_MESSAGES) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "The file says hi."}], "finish_reason": "stop"}]
    assert "sk-live-123456" not in json.dumps([dict(s.attributes or {}) for s in stack.spans()])
    assert attr(first, names.ATTR_SYSTEM_INSTRUCTIONS) is None  # Chat's system message stays in the history

    await stack.store.flushed()
    db = sqlite3.connect(stack.store.path)
    stored = db.execute("SELECT input_messages, output_messages FROM model_turns ORDER BY round").fetchall()
    assert stored == [(attr(s, names.ATTR_INPUT_MESSAGES), attr(s, names.ATTR_OUTPUT_MESSAGES))
                      for s in (first, second)]


@STREAM
async def test_responses_spans_carry_items_and_instructions(make_stack: StackFactory, stream: bool) -> None:
    stack = await make_stack(capture_message_content=True)
    _script_two_rounds(stack)
    answer = await stack.respond(stream, input="hello", instructions="Answer in English.")
    first, second = _chat_spans(stack, answer.headers["x-trace-id"])

    assert _content(first, names.ATTR_SYSTEM_INSTRUCTIONS) == [{"type": "text", "content": "Answer in English."}]
    assert _content(first, names.ATTR_INPUT_MESSAGES) == [
        {"role": "user", "parts": [{"type": "text", "content": "hello"}]}]
    [call] = _content(first, names.ATTR_OUTPUT_MESSAGES)[0]["parts"]
    assert (call["name"], call["arguments"]) == ("read_file", {"path": "/a", "api_key": "[REDACTED]"})
    sent = _content(second, names.ATTR_INPUT_MESSAGES)
    assert {"role": "tool", "parts": [{"type": "tool_call_response", "id": call["id"],
                                       "response": "contents of /a"}]} in sent
    [final] = _content(second, names.ATTR_OUTPUT_MESSAGES)
    assert final["parts"] == [{"type": "text", "content": "The file says hi."}]
    assert final["finish_reason"] == "stop"


async def test_no_message_content_by_default(make_stack: StackFactory) -> None:
    stack = await make_stack()
    _script_two_rounds(stack)
    await stack.ask(False, messages=USER)
    _script_two_rounds(stack)
    await stack.respond(True, input="hello", instructions="Answer in English.")
    chats = [s for s in stack.spans() if s.name.startswith(names.SPAN_CHAT_PREFIX + " ")]
    assert len(chats) == 4
    assert not [key for s in stack.spans() for key in CONTENT if key in (s.attributes or {})]
    await stack.store.flushed()
    db = sqlite3.connect(stack.store.path)
    assert db.execute("SELECT COUNT(*) FROM model_turns WHERE input_messages IS NOT NULL "
                      "OR output_messages IS NOT NULL OR tool_definitions IS NOT NULL").fetchone() == (0,)


# A tool the client declares beside the gateway's, with a secret default the span must not show.
CLIENT_TOOL = {"type": "function", "function": {
    "name": "log_in", "description": "Log in.",
    "parameters": {"type": "object", "properties": {"user": {"type": "string"},
                                                    "password": {"type": "string", "default": "sk-live-654321"}}}}}


async def test_chat_spans_carry_the_tools_offered(make_stack: StackFactory) -> None:
    """Every provider call's span names the tools it offered: the gateway's and the client's, as
    the conventions' tool definitions, a secret property's default masked; the store keeps them."""
    stack = await make_stack(capture_message_content=True)
    _script_two_rounds(stack)
    answer = await stack.ask(False, messages=USER, tools=[CLIENT_TOOL])
    first, second = _chat_spans(stack, answer.headers["x-trace-id"])
    offered = _content(first, names.ATTR_TOOL_DEFINITIONS)
    assert [(d["type"], d["name"]) for d in offered] == [
        ("function", "log_in"), ("function", "read_file"), ("function", "add")]
    login, read_file = offered[0], offered[1]
    assert read_file["description"] == "Read a file"
    assert read_file["parameters"]["required"] == ["path"]
    assert login["parameters"]["properties"]["password"] == {"type": "string", "default": "[REDACTED]"}
    assert _content(second, names.ATTR_TOOL_DEFINITIONS) == offered
    assert "sk-live-654321" not in json.dumps([dict(s.attributes or {}) for s in stack.spans()])
    await stack.store.flushed()
    db = sqlite3.connect(stack.store.path)
    stored = [json.loads(row[0]) for row in db.execute("SELECT tool_definitions FROM model_turns ORDER BY round")]
    assert stored == [offered, offered]


def test_each_api_reads_its_tools_as_definitions() -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    function = {"type": "function", "name": "find", "description": "Find.", "parameters": schema}
    assert CHAT.genai.tools({"tools": [{"type": "function", "function": {
        "name": "find", "description": "Find.", "parameters": schema}}, {"type": "custom", "custom": {"name": "sh"}}],
        "functions": [{"name": "old", "parameters": schema}]}) == [
        function, {"type": "custom", "name": "sh"}, {"type": "function", "name": "old", "parameters": schema}]
    assert RESPONSES.genai.tools({"tools": [
        {"type": "function", "name": "find", "description": "Find.", "parameters": schema, "strict": False},
        {"type": "web_search"}, {"type": "mcp", "server_label": "docs"}]}) == [
        function, {"type": "web_search", "name": "web_search"}, {"type": "mcp", "name": "docs"}]
    assert MESSAGES.genai.tools({"tools": [
        {"name": "find", "description": "Find.", "input_schema": schema},
        {"type": "web_search_20250305", "name": "web_search"}, "not a tool"]}) == [
        function, {"type": "web_search_20250305", "name": "web_search"}]
    assert CHAT.genai.tools({"messages": []}) == []


def test_tool_definitions_are_bounded() -> None:
    """Too many tools for the bound: the first keep their parameters, the rest only their names."""
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "d" * 100,
                                                "parameters": {"type": "object"}}} for i in range(20)]
    sent = MessageCapture(max_chars=1000).request_attributes(
        CHAT.genai, {"messages": USER, "tools": tools})[names.ATTR_TOOL_DEFINITIONS]
    assert len(sent) <= 1000
    kept = json.loads(sent)
    assert "description" in kept[0]
    assert kept[-1] == {"type": "function", "name": kept[-1]["name"]}
    assert [d["name"] for d in kept] == [f"tool_{i}" for i in range(len(kept))]
    assert len(kept) == 20


class Counted(dict[str, Any]):
    """A schema that counts the entries read of it (`read`, shared): what weighing, masking or
    writing it reads."""

    def __init__(self, read: list[int], entries: dict[str, Any]) -> None:
        super().__init__(entries)
        self.read = read

    def items(self) -> Any:
        for pair in super().items():
            self.read[0] += 1
            yield pair


def test_tool_definitions_cost_what_is_kept() -> None:
    """A tools list of megabytes: the tools past the bound are never masked or written, and a tool
    too big to keep whole is weighed only as far as the room left: the entries read are about
    the bound, not the list."""
    read = [0]
    properties = Counted(read, {f"p{i}": {"type": "string"} for i in range(20_000)})
    tools = [{"type": "function", "function": {"name": "huge", "parameters": {"properties": properties}}}] + [
        {"type": "function", "function": {"name": f"tool_{i}", "parameters": Counted(read, {"type": "object"})}}
        for i in range(20_000)]
    sent = MessageCapture(max_chars=1000, redact_keys=("password",)).request_attributes(
        CHAT.genai, {"messages": USER, "tools": tools})[names.ATTR_TOOL_DEFINITIONS]
    kept = json.loads(sent)
    assert len(sent) <= 1000
    assert kept[0] == {"type": "function", "name": "huge"}  # too big to keep whole
    assert [d["name"] for d in kept[1:]] == [f"tool_{i}" for i in range(len(kept) - 1)]  # the names fill the rest
    assert len(kept) > 20
    assert read[0] < 200  # of the 40,000 entries sent


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=30))
def test_a_definition_is_weighed_from_below(value: Any) -> None:
    """The weighing that keeps a tool too big from being masked and written never finds a value
    longer than its JSON is: a definition that fits is never left out for its weight."""
    assert not _longer_than(value, len(json.dumps(value, ensure_ascii=False)))


async def test_message_content_is_bounded(make_stack: StackFactory) -> None:
    stack = await make_stack(capture_message_content=True, message_content_max_chars=300)
    stack.script.then(Reply(content="x" * 1000))
    answer = await stack.ask(False, messages=[{"role": "user", "content": "old " * 200},
                                              {"role": "assistant", "content": "ok"},
                                              {"role": "user", "content": "new " * 200}])
    [span] = _chat_spans(stack, answer.headers["x-trace-id"])
    sent = attr(span, names.ATTR_INPUT_MESSAGES)
    assert len(sent) <= 300
    kept = json.loads(sent)  # still valid JSON: the oldest message went, the newest is cut
    assert "old old" not in sent
    assert len(kept) < 3
    newest = kept[-1]
    assert newest["role"] == "user"
    assert newest["parts"][0]["content"].startswith("new new")
    assert "truncated; 800 chars" in newest["parts"][0]["content"]
    [said] = json.loads(attr(span, names.ATTR_OUTPUT_MESSAGES))
    assert said["parts"][0]["content"].endswith("...[truncated; 1000 chars]")


def test_responses_items_as_messages() -> None:
    body = {"input": [
        {"role": "user", "content": [{"type": "input_text", "text": "hi"}, {"type": "input_image", "image_url": "x"}]},
        {"type": "reasoning", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "not json"},
        {"type": "function_call_output", "call_id": "c1", "output": "3"},
    ]}
    assert RESPONSES.genai.history(body) == [
        {"role": "user", "parts": [{"type": "text", "content": "hi"}, {"type": "input_image"}]},
        {"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "add", "arguments": "not json"}]},
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "3"}]}]
    output = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]}]
    assert output_message(RESPONSES.genai, output, "length") == {
        "role": "assistant", "parts": [{"type": "text", "content": "done"}], "finish_reason": "length"}


@pytest.mark.parametrize("text", ['{"password": "hunter2"}', 'my "api_key": "abc123456" here'])
def test_secret_pairs_in_text_are_masked(text: str) -> None:
    capture = MessageCapture(redact_keys=("password", "api_key"))
    sent = capture.request_attributes(CHAT.genai, {"messages": [{"role": "user", "content": text}]})
    assert "[REDACTED]" in sent[names.ATTR_INPUT_MESSAGES]
    assert "hunter2" not in sent[names.ATTR_INPUT_MESSAGES]
    assert "abc123456" not in sent[names.ATTR_INPUT_MESSAGES]
