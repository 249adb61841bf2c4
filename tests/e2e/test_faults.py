"""Faults end to end: bad requests, a failing or silent provider, broken streams, a client that
leaves mid-stream, garbled tool arguments and gateway bugs. Every one must end as an OpenAI-shaped
error (or an error event once a stream has begun) with every span ended and marked as an error."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestClient
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from gateway.apis import chat as chat_api
from gateway.demo.model import Reply
from gateway.settings.model import Settings
from telemetry import names
from tests.conftest import (
    STREAM,
    USER,
    Gateway,
    GatewayFactory,
    Stack,
    StackFactory,
    Traced,
    free_port,
    tool_messages,
)

USER_PARAM: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]  # USER, typed for openai
DEADLINE = 5.0


# --- helpers ------------------------------------------------------------------------------------


@dataclass
class Raw:
    """A response read with the aiohttp test client: status, headers, and the JSON body or the SSE events."""

    status: int
    headers: dict[str, str]
    body: Any = None
    events: list[Any] | None = None  # decoded `data:` payloads; "[DONE]" stays a string

    @property
    def trace_id(self) -> str:
        return self.headers["X-Trace-Id"]


async def post(http: TestClient[Any, Any], data: bytes | dict[str, Any], headers: dict[str, str] | None = None) -> Raw:
    """POST to the gateway's chat route without the openai client, which would refuse to send junk."""
    sent = {"Content-Type": "application/json", **(headers or {})}
    payload = data if isinstance(data, bytes) else json.dumps(data).encode()
    async with http.post("/v1/chat/completions", data=payload, headers=sent) as response:
        found = Raw(response.status, dict(response.headers))
        if response.content_type == "text/event-stream":
            found.events = [e if e == "[DONE]" else json.loads(e) for e in _data_lines(await response.read())]
        else:
            found.body = await response.json(content_type=None)
        return found


def _data_lines(raw: bytes) -> list[str]:
    return [line[len("data: "):] for line in raw.decode().split("\n") if line.startswith("data: ")]


def assert_openai_error(body: Any, *, type_: str | None = None, param: str | None = None,
                        code: str | None = None) -> dict[str, Any]:
    """`{"error": {"message", "type", "param", "code"}}` and nothing else; returns the inner object."""
    assert isinstance(body, dict)
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str)
    assert error["message"]
    assert "Traceback" not in error["message"]
    if type_ is not None:
        assert error["type"] == type_
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    return dict(error)


def ended(traced: Traced, trace_id: str, chats: int) -> dict[str, Any]:
    """The trace of a request the client has seen end: its SERVER span and `chats` chat spans
    have ended by then (the middleware records them before the last byte goes out)."""
    spans = traced.spans(trace_id)
    roots = [s for s in spans if s.parent is None]
    chat = [s for s in spans if s.name.startswith(names.SPAN_CHAT_PREFIX + " ")]
    [root] = roots
    assert root.kind is SpanKind.SERVER
    assert len(chat) == chats
    ids = {s.context.span_id for s in spans}
    # No span was left open: every parent named in the trace is itself in the exporter.
    assert all(s.parent is None or s.parent.span_id in ids for s in spans)
    return {"root": root, "chat": chat, "spans": spans}


def assert_error_spans(found: dict[str, Any], status: int | None = None, error_type: str | None = None) -> None:
    root: ReadableSpan = found["root"]
    # HTTP conventions: a SERVER span is an error for 5xx, for work cut short (499) and for a
    # stream that failed after its 200; a refused request (4xx) keeps UNSET and names error.type.
    refused = status is not None and 400 <= status < 499
    assert root.status.status_code is (StatusCode.UNSET if refused else StatusCode.ERROR)
    assert root.attributes is not None
    assert root.attributes[names.ATTR_ERROR_TYPE]
    if status is not None:
        assert root.attributes[names.ATTR_HTTP_STATUS] == status
    if error_type is not None:
        assert root.attributes[names.ATTR_ERROR_TYPE] == error_type
    for chat in found["chat"]:
        assert chat.kind is SpanKind.CLIENT
        assert chat.status.status_code is StatusCode.ERROR
        assert chat.attributes is not None
        assert chat.attributes[names.ATTR_ERROR_TYPE]
        assert chat.parent is not None
        assert chat.parent.span_id == root.context.span_id


async def status_error(client: AsyncOpenAI, stream: bool, **request: Any) -> openai.APIStatusError:
    """The error the openai client raises for a request the gateway refuses before any chunk."""
    request.setdefault("model", "test-model")
    request.setdefault("messages", USER)
    with pytest.raises(openai.APIStatusError) as caught:
        await _send(client, stream, request)
    return caught.value


async def _send(client: AsyncOpenAI, stream: bool, request: dict[str, Any]) -> None:
    if not stream:
        await client.chat.completions.create(**request)
        return
    async for _ in await client.chat.completions.create(stream=True, **request):
        pass


async def _drain(chunks: AsyncIterator[ChatCompletionChunk], into: list[str]) -> None:
    async for chunk in chunks:
        into += [c.delta.content or "" for c in chunk.choices]


def trace_of(exc: openai.APIStatusError) -> str:
    return exc.response.headers["x-trace-id"]


@pytest.fixture
async def unreachable(make_gateway: GatewayFactory) -> Gateway:
    """A gateway whose provider URL has nothing listening behind it (no scripted model at all)."""
    return await make_gateway(Settings(port=0, upstream=f"http://127.0.0.1:{free_port()}/v1",
                                       upstream_connect_timeout_seconds=2))


# --- requests the gateway refuses -----------------------------------------------------------------


@pytest.mark.parametrize("raw", [b"{not json", b"", b'{"model": "m", "messages": [', b"\xff\xfe"],
                         ids=["broken", "empty", "truncated", "binary"])
async def test_malformed_json_is_a_400(stack: Stack, raw: bytes) -> None:
    found = await post(stack.http, raw)
    assert found.status == 400
    error = assert_openai_error(found.body, type_="invalid_request_error", code="invalid_json")
    assert "not valid JSON" in error["message"]
    assert_error_spans(ended(stack, found.trace_id, chats=0), 400, "invalid_request_error")
    assert stack.upstream_requests == []


async def test_json_that_is_not_an_object_is_a_400(stack: Stack) -> None:
    found = await post(stack.http, b'[{"role": "user", "content": "hi"}]')
    assert found.status == 400
    error = assert_openai_error(found.body, type_="invalid_request_error", code="invalid_json")
    assert "JSON object" in error["message"]
    assert_error_spans(ended(stack, found.trace_id, chats=0), 400)


@pytest.mark.parametrize(("body", "param", "path"), [
    ({"model": "m"}, "messages", "messages"),
    ({"model": "m", "messages": "hello"}, "messages", "messages"),
    ({"model": "m", "messages": []}, "messages", "messages"),
    ({"messages": USER}, "model", "model"),
    ({"model": "m", "messages": USER, "tools": [{"type": "function", "function": {"description": "x"}}]},
     "tools", "tools.0.function.name"),
    ({"model": "m", "messages": USER, "tools": [{"type": "function", "function": {"name": ""}}]},
     "tools", "tools.0.function.name"),
    ({"model": "m", "messages": ["hello"]}, "messages", "messages.0"),
    ({"model": "", "messages": USER}, "model", "model"),
    ({"model": "m", "messages": USER, "tools": {"type": "function"}}, "tools", "tools"),
    ({"model": "m", "messages": USER, "tools": ["lookup"]}, "tools", "tools.0"),
    ({"model": "m", "messages": USER, "stream": "true"}, "stream", "stream"),
    ({"model": "m", "messages": USER, "stream_options": True}, "stream_options", "stream_options"),
    ({"model": "m", "messages": USER, "metadata": ["x"]}, "metadata", "metadata"),
], ids=["no-messages", "messages-not-a-list", "messages-empty", "no-model", "tool-without-name",
        "tool-empty-name", "message-not-an-object", "model-empty", "tools-not-a-list", "tool-not-an-object",
        "stream-not-a-boolean", "stream-options-not-an-object", "metadata-not-an-object"])
async def test_json_that_is_not_a_chat_request_names_the_field(stack: Stack, body: dict[str, Any], param: str,
                                                               path: str) -> None:
    found = await post(stack.http, body)
    assert found.status == 400
    error = assert_openai_error(found.body, type_="invalid_request_error", param=param)
    assert path in error["message"]
    assert_error_spans(ended(stack, found.trace_id, chats=0), 400)
    assert stack.upstream_requests == []


async def test_oversized_body_is_a_413(make_stack: StackFactory) -> None:
    stack = await make_stack(max_body_bytes=2048)
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 10_240}]}
    found = await post(stack.http, body)
    assert found.status == 413
    assert found.headers["Content-Type"].startswith("application/json")
    error = assert_openai_error(found.body, type_="invalid_request_error", code="body_too_large")
    assert "2048" in error["message"]
    assert "larger than the Maximum" not in error["message"]  # aiohttp's sentence is not spliced into ours
    assert_error_spans(ended(stack, found.trace_id, chats=0), 413)
    assert stack.upstream_requests == []


@STREAM
async def test_caller_tool_named_like_a_gateway_tool_is_a_400(stack: Stack, stream: bool) -> None:
    mine = {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError) as caught:
        await stack.ask(stream, messages=USER, tools=[mine])
    exc = caught.value
    assert exc.status_code == 400
    error = assert_openai_error(exc.response.json(), type_="invalid_request_error", param="tools",
                                code="tool_name_conflict")
    assert "'read_file'" in error["message"]
    assert_error_spans(ended(stack, trace_of(exc), chats=0), 400)
    assert stack.upstream_requests == []


# --- a provider that fails before answering ---------------------------------------------------------


@STREAM
async def test_unreachable_upstream_is_a_502(unreachable: Gateway, stream: bool) -> None:
    exc = await status_error(unreachable.client, stream)
    assert isinstance(exc, openai.InternalServerError)
    assert exc.status_code == 502
    error = assert_openai_error(exc.response.json(), type_="upstream_error")
    assert "could not reach the provider" in error["message"]
    assert_error_spans(ended(unreachable, trace_of(exc), chats=1), 502, "upstream_error")


@STREAM
async def test_upstream_that_never_answers_is_a_504(make_stack: StackFactory, stream: bool) -> None:
    stack = await make_stack(upstream_timeout_seconds=1.0)
    stack.script.then(Reply(hang=True))
    exc = await status_error(stack.client, stream)
    assert isinstance(exc, openai.InternalServerError)
    assert exc.status_code == 504
    assert_openai_error(exc.response.json(), type_="upstream_timeout")
    assert_error_spans(ended(stack, trace_of(exc), chats=1), 504, "upstream_timeout")
    assert len(stack.upstream_requests) == 1


@STREAM
@pytest.mark.parametrize("status", [500, 503])
async def test_upstream_server_error_is_a_502(stack: Stack, stream: bool, status: int) -> None:
    stack.script.then(Reply(status=status, error="provider is on fire"))
    exc = await status_error(stack.client, stream)
    assert isinstance(exc, openai.InternalServerError)
    assert exc.status_code == 502
    error = assert_openai_error(exc.response.json(), type_="upstream_error", code=f"upstream_{status}")
    assert str(status) in error["message"]
    found = ended(stack, trace_of(exc), chats=1)
    assert_error_spans(found, 502, "upstream_error")
    [chat] = found["chat"]
    assert chat.attributes is not None
    assert chat.attributes[names.ATTR_HTTP_STATUS] == 502


@STREAM
async def test_upstream_answer_that_is_not_json_is_a_502(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(raw=b"{not json"))
    exc = await status_error(stack.client, stream)
    assert exc.status_code == 502
    error = assert_openai_error(exc.response.json(), type_="upstream_error")
    assert "not JSON" in error["message"]
    assert_error_spans(ended(stack, trace_of(exc), chats=1), 502, "upstream_error")


@STREAM
@pytest.mark.parametrize(("status", "kind"), [(400, openai.BadRequestError), (429, openai.RateLimitError)],
                         ids=["400", "429"])
async def test_upstream_refusal_passes_through(stack: Stack, stream: bool, status: int,
                                              kind: type[openai.APIStatusError]) -> None:
    stack.script.then(Reply(status=status, error="slow down", headers={"retry-after": "7"}))
    exc = await status_error(stack.client, stream)
    assert isinstance(exc, kind)
    assert exc.status_code == status
    assert exc.response.headers["retry-after"] == "7"
    body = exc.response.json()
    assert body == {"error": {"message": "slow down", "type": "scripted_error", "param": None, "code": None}}
    found = ended(stack, trace_of(exc), chats=1)
    assert_error_spans(found, status)
    [chat] = found["chat"]
    assert chat.attributes is not None
    assert chat.attributes[names.ATTR_HTTP_STATUS] == status


# --- a stream that goes wrong once it has begun -------------------------------------------------------


async def test_broken_stream_ends_with_an_error_event(stack: Stack) -> None:
    stack.script.then(Reply(content="hello world, a long answer", break_stream_after=3))
    found = await post(stack.http, {"model": "test-model", "messages": USER, "stream": True})
    assert found.status == 200  # the stream had begun before it broke
    assert found.events is not None
    assert found.events[0]["choices"][0]["delta"]["role"] == "assistant"
    *chunks, last = found.events
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "hello world,"
    assert_openai_error(last, type_="upstream_error")
    assert "[DONE]" not in found.events  # a broken answer is never presented as a complete one
    assert_error_spans(ended(stack, found.trace_id, chats=1), 200, "upstream_error")


async def test_broken_stream_raises_in_the_openai_client(stack: Stack) -> None:
    stack.script.then(Reply(content="hello world, a long answer", break_stream_after=3))
    raw = await stack.client.chat.completions.with_raw_response.create(model="test-model", messages=USER_PARAM,
                                                                       stream=True)
    received: list[str] = []
    with pytest.raises(openai.APIError) as caught:
        await _drain(raw.parse(), received)
    assert not isinstance(caught.value, openai.APIStatusError)
    assert "stream" in caught.value.message
    assert "".join(received) == "hello world,"
    assert_error_spans(ended(stack, raw.headers["x-trace-id"], chats=1))


async def test_stream_stalling_mid_way_ends_with_a_timeout_event(make_stack: StackFactory) -> None:
    stack = await make_stack(upstream_timeout_seconds=0.3)
    stack.script.then(Reply(content="hello world, a long answer", pause_after=2))
    found = await post(stack.http, {"model": "test-model", "messages": USER, "stream": True})
    assert found.status == 200
    assert found.events is not None
    assert_openai_error(found.events[-1], type_="upstream_timeout")
    assert_error_spans(ended(stack, found.trace_id, chats=1), 200, "upstream_timeout")
    await asyncio.wait_for(stack.model.dropped.wait(), DEADLINE)  # and the stalled provider was hung up on


async def test_client_leaving_mid_stream_cancels_the_upstream_call(stack: Stack) -> None:
    stack.script.then(Reply(content="hello world, a long answer", pause_after=3))
    body = {"model": "test-model", "messages": USER, "stream": True}
    response = await stack.http.post("/v1/chat/completions", json=body)
    assert response.status == 200
    trace_id = response.headers["X-Trace-Id"]
    first = await asyncio.wait_for(response.content.readline(), DEADLINE)
    assert first.startswith(b"data: ")
    await asyncio.wait_for(stack.model.paused.wait(), DEADLINE)
    response.close()  # the client hangs up while the provider is mid-answer
    await asyncio.wait_for(stack.model.dropped.wait(), DEADLINE)
    found = ended(stack, trace_id, chats=1)
    assert_error_spans(found, 499, "cancelled")
    assert len(stack.upstream_requests) == 1


# --- the model's faults go back to the model ----------------------------------------------------------


@STREAM
async def test_garbled_tool_arguments_go_back_to_the_model(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(tool_calls=[("read_file", "{not json")]), Reply(content="Sorry, fixed."))
    answer = await stack.ask(stream, messages=USER)
    assert answer.content == "Sorry, fixed."
    assert answer.finish_reason == "stop"
    assert answer.tool_calls == []
    _, second = stack.upstream_requests
    [rejection] = tool_messages(second)
    assert rejection["tool_call_id"] == second["messages"][1]["tool_calls"][0]["id"]
    assert "not valid JSON" in rejection["content"]
    assert "read_file" in rejection["content"]
    found = ended(stack, answer.headers["x-trace-id"], chats=2)
    root: ReadableSpan = found["root"]
    assert root.status.status_code is not StatusCode.ERROR
    assert all(c.status.status_code is not StatusCode.ERROR for c in found["chat"])
    [call] = [s for s in found["spans"] if s.name == names.SPAN_TOOL_CALL]
    assert call.attributes is not None
    assert call.attributes[names.ATTR_OUTCOME] == "rejected"
    assert call.attributes[names.ATTR_REJECTION_REASON] == "invalid_json"


# --- the gateway's own faults -------------------------------------------------------------------------


@STREAM
async def test_gateway_bug_is_a_500_without_traceback(stack: Stack, stream: bool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any) -> Any:
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(chat_api, "plan_chat", broken)
    found = await post(stack.http, {"model": "test-model", "messages": USER, "stream": stream})
    assert found.status == 500
    error = assert_openai_error(found.body, type_="server_error", code="internal_error")
    text = json.dumps(found.body)
    assert "Traceback" not in text
    assert "secret internal detail" not in text
    assert "RuntimeError" not in text
    assert_error_spans(ended(stack, found.trace_id, chats=0), 500, "server_error")
    assert error["message"]
    assert stack.upstream_requests == []
