"""Hardening, the telemetry side (issue 10): labels and attributes bounded whatever a caller or a
provider sends, no secrets on spans, retry state bounded and scoped by gateway key, a stream cut
short counted as a failure, /metrics behind its own key, and sampling decided by the gateway."""

from __future__ import annotations

import json
from typing import Any

import pytest
from opentelemetry.trace import SpanKind, StatusCode
from pydantic import BaseModel, Field

from gateway.demo.model import Reply
from gateway.settings.model import Settings
from gateway.tools import Tool, ToolError, ToolRegistry
from telemetry import names
from tests.conftest import (
    AUTH,
    REMOTE_SPAN,
    REMOTE_TRACE,
    STREAM,
    TEST_KEY,
    TRACEPARENT,
    USER,
    Stack,
    StackFactory,
    every_outcome_registry,
    sample_registry,
    server_span,
    tool_call_spans,
    tree,
)

LONG = 300_000  # the length of a hostile model name: three of them took /metrics from 22 KB to 21 MB


def sse(*events: dict[str, Any], done: bool = True) -> bytes:
    """A recorded stream: these events as a provider writes them (then [DONE], for Chat)."""
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return body + (b"data: [DONE]\n\n" if done else b"")


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-rec", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


async def metrics_page(stack: Stack, headers: dict[str, str] | None = None) -> tuple[int, str]:
    async with stack.http.get("/metrics", headers=headers or {}) as response:
        return response.status, await response.text()


def chat_spans(stack: Stack) -> list[Any]:
    return [s for s in stack.spans() if s.kind is SpanKind.CLIENT]


# --- item 1: labels and attributes of bounded length --------------------------------------------------

@STREAM
async def test_a_long_model_name_is_one_bounded_label(make_stack: StackFactory, stream: bool) -> None:
    stack = await make_stack()
    for n in range(3):
        stack.script.then(Reply(content="hi"))
        await stack.ask(stream, messages=USER, model=f"{n}{'m' * LONG}")
    status, page = await metrics_page(stack)
    assert status == 200
    assert len(page) < 64_000, "a caller's model name reached the metrics page"
    assert stack.metric(names.METRIC_UPSTREAM_REQUESTS, model=names.OTHER_MODEL, status="200") == 3
    # Names past the length limit take no slot of the distinct-model budget.
    stack.script.then(Reply(content="hi"))
    await stack.ask(stream, messages=USER, model="gpt-4o")
    assert stack.metric(names.METRIC_UPSTREAM_REQUESTS, model="gpt-4o", status="200") == 1
    for span in chat_spans(stack):
        attributes = span.attributes or {}
        assert len(span.name) <= 200
        assert len(str(attributes[names.ATTR_REQUEST_MODEL])) <= 200
        assert len(str(attributes.get(names.ATTR_RESPONSE_MODEL, ""))) <= 200  # the scripted model echoes it


async def test_the_label_length_is_a_setting(make_stack: StackFactory) -> None:
    stack = await make_stack(metrics_max_label_chars=8)
    stack.script.then(Reply(content="hi"), Reply(content="hi"))
    await stack.ask(False, messages=USER, model="12345678")
    await stack.ask(False, messages=USER, model="123456789")
    assert stack.metric(names.METRIC_UPSTREAM_REQUESTS, model="12345678", status="200") == 1
    assert stack.metric(names.METRIC_UPSTREAM_REQUESTS, model=names.OTHER_MODEL, status="200") == 1


async def test_what_a_provider_names_is_bounded_on_the_chat_span(stack: Stack) -> None:
    huge = "r" * 100_000
    stack.script.then(Reply(raw=json.dumps({
        "id": huge, "object": "chat.completion", "created": 1, "model": huge,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": huge}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()))
    async with stack.http.post("/v1/chat/completions", json={"model": "m", "messages": USER}) as response:
        assert response.status == 200
    [span] = chat_spans(stack)
    attributes = span.attributes or {}
    for key in (names.ATTR_RESPONSE_ID, names.ATTR_RESPONSE_MODEL):
        assert 0 < len(str(attributes[key])) <= 200, key
    [reason] = attributes[names.ATTR_FINISH_REASONS]  # type: ignore[misc]
    assert len(reason) <= 200


# --- item 7: no secrets on spans ---------------------------------------------------------------------

class Auth(BaseModel):
    passwd: str = Field(min_length=12)


class Login(BaseModel):
    user: str
    password: str = Field(min_length=12)
    api_key: str = Field(pattern=r"^sk-")
    auth: Auth
    retries: int


def login(args: dict[str, Any]) -> str:
    return "ok"


def leaky(args: dict[str, Any]) -> str:
    raise ValueError(f"cannot log in with {args}")  # a Python repr: single-quoted keys


def quoting(args: dict[str, Any]) -> str:
    raise ToolError(f"the password {args.get('password')} was refused")


def secrets_registry() -> ToolRegistry:
    return ToolRegistry([Tool(name="login", args_model=Login, function=login),
                         Tool(name="leaky", function=leaky), Tool(name="quoting", function=quoting)])


async def invoke(stack: Stack, tool: str, arguments: Any) -> tuple[dict[str, Any], Any]:
    async with stack.http.post(f"/v1/tools/{tool}/invoke", json={"arguments": arguments}) as response:
        assert response.status == 200
        body: dict[str, Any] = await response.json()
        [span] = tool_call_spans(stack, response.headers["X-Trace-Id"])
    return body, span


async def test_a_rejection_quoting_a_secret_keeps_it_off_the_span(make_stack: StackFactory) -> None:
    stack = await make_stack(registry=secrets_registry())
    body, span = await invoke(stack, "login", {"user": "bob-the-user", "password": "hunter2", "api_key": "leaky-1",
                                               "auth": {"passwd": "swordfish"}, "retries": "many-times"})
    assert body["status"] == "rejected"
    assert '(got "hunter2")' in body["content"]  # the model sent it; the model may see it again
    assert span.status.status_code is StatusCode.ERROR
    description = span.status.description or ""
    for secret in ("hunter2", "leaky-1", "swordfish"):
        assert secret not in description
        assert secret not in json.dumps(dict(span.attributes or {}))
    assert "- password: String should have at least 12 characters (got [REDACTED])" in description
    assert "- auth.passwd: String should have at least 12 characters (got [REDACTED])" in description
    assert '(got "many-times")' in description  # not a secret: what the operator needs to see


@pytest.mark.parametrize(("tool", "arguments"), [
    ("leaky", {"user": "bob", "password": "hunter2-hunter2"}),
    ("quoting", {"password": "hunter2-hunter2"}),
], ids=["repr-of-the-arguments", "the-value-quoted"])
async def test_a_tool_error_quoting_a_secret_keeps_it_off_the_span(make_stack: StackFactory, tool: str,
                                                                   arguments: dict[str, Any]) -> None:
    stack = await make_stack(registry=secrets_registry(), record_tool_arguments=True)
    body, span = await invoke(stack, tool, arguments)
    assert body["status"] == "error"
    assert "hunter2-hunter2" in body["content"]
    assert "hunter2-hunter2" not in (span.status.description or "")
    assert "hunter2-hunter2" not in json.dumps(dict(span.attributes or {}))
    assert "[REDACTED]" in (span.status.description or "")


@pytest.mark.parametrize("arguments", [
    "{'password': 'hunter2', 'path': 'a'}",
    "{'api-key': 'hunter2'}",
    '{"x-api-key": "hunter2"',
    "{passwd: hunter2}",
], ids=["single-quoted", "api-key", "x-api-key-cut-short", "bare-passwd"])
async def test_arguments_that_are_not_json_are_masked_on_the_span(stack: Stack, arguments: str) -> None:
    body, span = await invoke(stack, "read_file", arguments)
    assert body["rejection"] == {"reason": "invalid_json"}
    recorded = str((span.attributes or {})[names.ATTR_TOOL_CALL_ARGUMENTS])
    assert "hunter2" not in recorded
    assert "[REDACTED]" in recorded


async def test_the_default_redact_list_covers_the_usual_header_and_field_names(stack: Stack) -> None:
    arguments = {"api-key": "v1", "x-api-key": "v2", "passwd": "v3", "X_Api_Key": "v4", "file_path": "keep"}
    body, span = await invoke(stack, "read_file", arguments)
    assert body["status"] == "rejected"
    recorded = json.loads(str((span.attributes or {})[names.ATTR_TOOL_CALL_ARGUMENTS]))
    assert recorded == {"api-key": "[REDACTED]", "x-api-key": "[REDACTED]", "passwd": "[REDACTED]",
                        "X_Api_Key": "[REDACTED]", "file_path": "keep"}


# --- item 9: retry state scoped by gateway key ---------------------------------------------------------

async def test_one_keys_call_is_never_a_retry_of_another_keys_call(make_stack: StackFactory) -> None:
    keys = {"alice": {"key": TEST_KEY}, "bob": {"key": "tsk-bob-0000"}}
    stack = await make_stack(registry=every_outcome_registry(), keys=keys)
    shared = {"X-Trajectory-Id": "shared-trajectory"}
    trace_ids = []
    for key in (TEST_KEY, "tsk-bob-0000", TEST_KEY):
        stack.script.then(Reply(tool_calls=[("locked", {})]), Reply(content="done"))
        async with stack.http.post("/v1/chat/completions", json={"model": "m", "messages": USER},
                                   headers={"Authorization": f"Bearer {key}", **shared}) as response:
            assert response.status == 200
            trace_ids.append(response.headers["X-Trace-Id"])
    [[alice], [bob], [alice_again]] = [tool_call_spans(stack, t) for t in trace_ids]
    assert names.ATTR_RETRY_KIND not in (bob.attributes or {}), "bob's call was linked to alice's"
    assert list(bob.links) == []
    # Alice's own retry still counts, linked to her first call, not to bob's.
    assert (alice_again.attributes or {})[names.ATTR_RETRY_KIND] == "verbatim"
    [link] = alice_again.links
    assert link.context.span_id == alice.context.span_id


# --- item 10: a provider stream cut short -------------------------------------------------------------

async def test_a_chat_stream_without_a_finish_reason_is_a_failed_provider_call(stack: Stack) -> None:
    stack.script.then(Reply(raw_stream=sse(chunk({"role": "assistant", "content": "Hel"}), chunk({"content": "lo"}))))
    async with stack.http.post("/v1/chat/completions", json={"model": "m", "messages": USER, "stream": True},
                               headers=AUTH) as response:
        text = await response.text()
        trace_id = response.headers["X-Trace-Id"]
    assert '"error"' in text
    [span] = tree(stack.spans(trace_id))["chat"]
    assert span.status.status_code is StatusCode.ERROR
    assert (span.attributes or {})[names.ATTR_ERROR_TYPE] == "upstream_error"
    assert stack.metric(names.METRIC_UPSTREAM_REQUESTS, model="m", status="200") == 0
    assert stack.metric(names.METRIC_UPSTREAM_REQUESTS, model="m", status="502") == 1


async def test_a_responses_stream_without_its_completion_is_a_failed_provider_call(stack: Stack) -> None:
    created = {"id": "resp_1", "object": "response", "status": "in_progress", "model": "m", "output": []}
    stack.script.then(Reply(raw_stream=sse({"type": "response.created", "sequence_number": 0, "response": created},
                                           done=False)))
    async with stack.http.post("/v1/responses", json={"model": "m", "input": "hello", "stream": True},
                               headers=AUTH) as response:
        await response.text()
        trace_id = response.headers["X-Trace-Id"]
    [span] = tree(stack.spans(trace_id))["chat"]
    assert span.status.status_code is StatusCode.ERROR
    assert stack.metric(names.METRIC_UPSTREAM_REQUESTS, model="m", status="200") == 0
    assert stack.metric(names.METRIC_UPSTREAM_REQUESTS, model="m", status="502") == 1


# --- tenancy: /metrics behind its own key ------------------------------------------------------------

METRICS_KEY = "tsk-metrics-scraper"


@pytest.mark.parametrize("authorization", [None, "Bearer wrong-key-1234", METRICS_KEY, f"Bearer {TEST_KEY}",
                                           "Basic dXNlcjpwYXNz"])
async def test_metrics_need_the_metrics_key_when_one_is_set(make_stack: StackFactory,
                                                            authorization: str | None) -> None:
    stack = await make_stack(keys={"alice": {"key": TEST_KEY}}, metrics_key=METRICS_KEY)
    headers = {"Authorization": authorization} if authorization is not None else {}
    async with stack.http.get("/metrics", headers=headers) as response:
        assert response.status == 401
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
        body = await response.json()
    assert body["error"]["type"] == "authentication_error"
    assert set(body["error"]) == {"message", "type", "param", "code"}


async def test_metrics_answer_the_metrics_key(make_stack: StackFactory) -> None:
    stack = await make_stack(keys={"alice": {"key": TEST_KEY}}, metrics_key=METRICS_KEY)
    status, page = await metrics_page(stack, {"Authorization": f"Bearer {METRICS_KEY}"})
    assert status == 200
    assert names.METRIC_REQUESTS in page
    for path in ("/healthz", "/readyz"):  # probes stay open
        async with stack.http.get(path) as response:
            assert response.status == 200


def test_the_metrics_key_is_never_shown() -> None:
    settings = Settings(metrics_key=METRICS_KEY)
    assert METRICS_KEY not in repr(settings)
    assert settings.metrics_key is not None
    assert settings.metrics_key.get_secret_value() == METRICS_KEY


# --- tenancy: the gateway's own sampling decision -----------------------------------------------------

UNSAMPLED = TRACEPARENT[:-2] + "00"


@STREAM
async def test_by_default_a_callers_unsampled_trace_context_is_followed(make_stack: StackFactory,
                                                                        stream: bool) -> None:
    stack = await make_stack(registry=sample_registry())
    stack.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 2})]), Reply(content="3"))
    answer = await stack.ask(stream, messages=USER, extra_headers={"traceparent": UNSAMPLED})
    assert answer.headers["x-trace-id"] == REMOTE_TRACE
    assert stack.spans() == []  # the documented default: the caller decides


@STREAM
async def test_own_sampling_records_what_a_caller_did_not_sample(make_stack: StackFactory, stream: bool) -> None:
    stack = await make_stack(registry=sample_registry(), trace_sampling="own")
    stack.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 2})]), Reply(content="3"))
    answer = await stack.ask(stream, messages=USER, extra_headers={"traceparent": UNSAMPLED})
    trace_id = answer.headers["x-trace-id"]
    assert trace_id != REMOTE_TRACE
    found = tree(stack.spans(trace_id))
    root = found["root"]
    assert root.parent is None
    [link] = root.links
    assert (format(link.context.trace_id, "032x"), format(link.context.span_id, "016x")) == (REMOTE_TRACE, REMOTE_SPAN)
    assert [(s.attributes or {})[names.ATTR_TOOL_NAME] for s in found["tool_calls"]] == ["add"]
    # The provider sees the gateway's trace, not the caller's.
    for headers in stack.model.request_headers:
        assert headers["traceparent"].split("-")[1] == trace_id


async def test_own_sampling_without_a_caller_context_is_an_ordinary_root(make_stack: StackFactory) -> None:
    stack = await make_stack(trace_sampling="own")
    stack.script.then(Reply(content="hi"))
    answer = await stack.ask(False, messages=USER)
    root = server_span(stack, answer.headers["x-trace-id"])
    assert root.parent is None
    assert list(root.links) == []


def test_trace_sampling_takes_only_follow_or_own() -> None:
    assert Settings().trace_sampling == "follow"
    with pytest.raises(ValueError, match="trace_sampling"):
        Settings(trace_sampling="never")
