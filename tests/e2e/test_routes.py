"""The HTTP surface besides chat: pass-through, trace and trajectory headers, the tool routes,
metrics and health, and the provider key."""

from __future__ import annotations

import gzip
import json
import re
import zlib
from typing import Any

import pytest
from opentelemetry.trace import SpanKind
from pytest_aiohttp import AiohttpClient

from gateway.demo.agent import FastPolicy
from gateway.demo.model import Reply, ScriptedModel
from gateway.tools import Param, Tool, ToolRegistry
from telemetry import names
from tests.conftest import (
    REMOTE_SPAN,
    REMOTE_TRACE,
    TRACEPARENT,
    USER,
    Stack,
    StackFactory,
    server_span,
    tool_call_spans,
    tree,
)

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


# --- pass-through ---------------------------------------------------------------------------------

async def test_models_list_passes_through(stack: Stack) -> None:
    page = await stack.client.models.list()
    assert [m.id for m in page.data] == [stack.model.model_name]
    assert page.data[0].owned_by == "toolspan"


GZIPPED = gzip.compress(b'{"input": "compressed on the way in"}' * 50)


@pytest.mark.parametrize(("body", "headers", "echoed"), [
    (bytes(range(256)) * 4, {"Content-Type": "application/octet-stream"}, bytes(range(256)) * 4),
    (b"\xff\xfe\x00not utf-8\xc3\x28", {"Content-Type": "text/plain; charset=latin-1"},
     b"\xff\xfe\x00not utf-8\xc3\x28"),
    (b"", {"Content-Type": "application/json"}, b""),
    # The provider decodes what it receives; the gateway must hand it the compressed bytes and the
    # header that says so, untouched, for the echo to come back as the original text.
    (GZIPPED, {"Content-Type": "application/json", "Content-Encoding": "gzip"}, gzip.decompress(GZIPPED)),
    (zlib.compress(b"deflated " * 100), {"Content-Type": "text/plain", "Content-Encoding": "Deflate"},
     b"deflated " * 100),
], ids=["all-bytes", "not-utf8", "empty", "gzip", "deflate"])
async def test_echo_comes_back_byte_for_byte(stack: Stack, aiohttp_client: AiohttpClient, body: bytes,
                                             headers: dict[str, str], echoed: bytes) -> None:
    raw = await aiohttp_client(stack.http.server, auto_decompress=False)  # sees exactly the bytes the gateway sent
    async with raw.post("/v1/echo", data=body, headers=headers) as response:
        received = await response.read()
        assert response.status == 200
        assert received == echoed
        assert response.headers["X-Echo-Method"] == "POST"
        assert response.headers["Content-Type"].split(";")[0] == headers["Content-Type"].split(";")[0]
        assert re.fullmatch(r"[0-9a-f]{32}", response.headers["X-Trajectory-Id"])
        trace_id = response.headers["X-Trace-Id"]
    assert server_span(stack, trace_id).attributes[names.ATTR_HTTP_STATUS] == 200  # type: ignore[index]


async def test_upstream_404_passes_through(stack: Stack) -> None:
    async with stack.http.get("/v1/no/such/thing?x=1") as response:
        assert response.status == 404
        # The provider's own text, in OpenAI's shape (it sent text/plain).
        error = (await response.json())["error"]
        assert error["message"] == "the provider answered 404: 404: Not Found"
        assert error["code"] == "upstream_404"
        assert response.headers["X-Trace-Id"]
        assert response.headers["X-Trajectory-Id"]
        trace_id = response.headers["X-Trace-Id"]
    span = server_span(stack, trace_id)
    assert span.attributes[names.ATTR_HTTP_STATUS] == 404  # type: ignore[index]
    assert span.attributes[names.ATTR_URL_PATH] == "/v1/no/such/thing"  # type: ignore[index]


# --- trace and trajectory headers ------------------------------------------------------------------

# (a probe makes no span: tests/telemetry/test_instrument_probes.py)
@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/tools"), ("GET", "/v1/models"),
                                              ("POST", "/v1/tools/add/invoke")])
async def test_incoming_traceparent_is_honoured(stack: Stack, method: str, path: str) -> None:
    body = {"arguments": {"a": 1, "b": 2}} if method == "POST" else None
    async with stack.http.request(method, path, json=body, headers={"traceparent": TRACEPARENT}) as response:
        assert response.status == 200
        assert response.headers["X-Trace-Id"] == REMOTE_TRACE
    span = server_span(stack, REMOTE_TRACE)
    assert span.parent is not None
    assert span.parent.is_remote
    assert format(span.parent.span_id, "016x") == REMOTE_SPAN


async def test_chat_propagates_the_trace_to_the_provider(stack: Stack) -> None:
    stack.script.then(Reply(content="hi"))
    raw = await stack.client.chat.completions.with_raw_response.create(
        model="m", messages=USER, extra_headers={"traceparent": TRACEPARENT})  # type: ignore[arg-type]
    assert raw.headers["x-trace-id"] == REMOTE_TRACE
    [chat] = [s for s in stack.spans(REMOTE_TRACE) if s.kind is SpanKind.CLIENT]
    [headers] = stack.model.request_headers
    assert headers["traceparent"] == f"00-{REMOTE_TRACE}-{format(chat.context.span_id, '016x')}-01"


async def test_incoming_trajectory_id_is_kept(stack: Stack) -> None:
    sent = "agent-run_42.step:7"
    async with stack.http.post("/v1/tools/add/invoke", json={"arguments": {"a": 1, "b": 1}},
                               headers={"X-Trajectory-Id": sent}) as response:
        assert response.status == 200
        assert response.headers["X-Trajectory-Id"] == sent
        trace_id = response.headers["X-Trace-Id"]
    assert server_span(stack, trace_id).attributes[names.ATTR_CONVERSATION_ID] == sent  # type: ignore[index]
    [call] = tool_call_spans(stack, trace_id)
    assert call.attributes[names.ATTR_CONVERSATION_ID] == sent  # type: ignore[index]


@pytest.mark.parametrize("sent", ["has space", "x" * 129, "slash/inside", "semi;colon", ""],
                         ids=["space", "too-long", "slash", "semicolon", "empty"])
async def test_malformed_trajectory_id_is_replaced(stack: Stack, sent: str) -> None:
    async with stack.http.get("/v1/tools", headers={"X-Trajectory-Id": sent}) as response:
        assert response.status == 200
        generated = response.headers["X-Trajectory-Id"]
        trace_id = response.headers["X-Trace-Id"]
    assert generated != sent
    assert re.fullmatch(r"[0-9a-f]{32}", generated)
    # A listing is part of no trajectory: its span names none (one minted for it would be a session of its own).
    assert names.ATTR_CONVERSATION_ID not in (server_span(stack, trace_id).attributes or {})


async def test_each_request_gets_its_own_trajectory_when_none_is_sent(stack: Stack) -> None:
    seen = set()
    for _ in range(3):
        async with stack.http.get("/v1/tools") as response:
            seen.add((response.headers["X-Trajectory-Id"], response.headers["X-Trace-Id"]))
    assert len({t for t, _ in seen}) == 3
    assert len({t for _, t in seen}) == 3


# --- tool routes -----------------------------------------------------------------------------------

async def test_list_tools_as_openai_specs(stack: Stack) -> None:
    async with stack.http.get("/v1/tools") as response:
        assert response.status == 200
        listing = await response.json()
    assert listing["object"] == "list"
    assert [t["type"] for t in listing["data"]] == ["function", "function"]
    read_file, add = (t["function"] for t in listing["data"])
    assert (read_file["name"], read_file["description"]) == ("read_file", "Read a file")
    assert read_file["parameters"]["type"] == "object"
    assert set(read_file["parameters"]["properties"]) == {"path", "offset"}
    assert read_file["parameters"]["properties"]["offset"]["type"] == "integer"
    assert read_file["parameters"]["required"] == ["path"]
    assert (add["name"], add["description"]) == ("add", "Add two numbers")
    assert sorted(add["parameters"]["required"]) == ["a", "b"]


async def invoke(stack: Stack, name: str, payload: Any, route: str = "invoke") -> tuple[int, Any, str]:
    async with stack.http.post(f"/v1/tools/{name}/{route}", json=payload) as response:
        return response.status, await response.json(), response.headers["X-Trace-Id"]


@pytest.mark.parametrize("arguments", [{"a": 2, "b": 40}, '{"a": 2, "b": 40}'], ids=["object", "json-text"])
async def test_invoke_runs_the_tool_in_one_tool_call_span(stack: Stack, arguments: Any) -> None:
    status, body, trace_id = await invoke(stack, "add", {"arguments": arguments})
    assert status == 200
    assert body["status"] == "ok"
    assert body["content"] == "42"
    assert body["tool"] == "add"
    assert body["tool_call_id"].startswith("call_")
    found = tree(stack.spans(trace_id))
    [call] = found["tool_calls"]
    assert call.attributes[names.ATTR_TOOL_NAME] == "add"
    assert call.attributes[names.ATTR_OUTCOME] == "ok"
    assert call.attributes[names.ATTR_TOOL_CALL_ID] == body["tool_call_id"]
    assert found["root"].attributes[names.ATTR_HTTP_ROUTE] == "/v1/tools/{name}/invoke"
    steps = [s.name for s in stack.spans(trace_id) if s.parent is not None and s.parent.span_id == call.context.span_id]
    assert steps == [names.SPAN_TOOL_PARSE, names.SPAN_TOOL_EXECUTE]
    assert stack.model.requests == []  # no model involved
    assert stack.metric(names.METRIC_TOOL_CALLS, tool="add", outcome="ok") == 1


async def test_invoke_with_a_renamed_argument_is_rejected(stack: Stack) -> None:
    status, body, trace_id = await invoke(stack, "read_file", {"arguments": {"file_path": "a.txt"}})
    assert status == 200  # the call was handled; its outcome is the rejection
    assert body["status"] == "rejected"
    assert body["rejection"] == {"reason": "missing_arguments"}
    assert "Missing: path" in body["content"]
    assert "file_path (did you mean 'path'?)" in body["content"]
    assert body["arguments_check"]["missing"] == ["path"]
    assert body["arguments_check"]["unrecognized"] == ["file_path"]
    assert body["arguments_check"]["suggestions"] == {"file_path": "path"}
    [call] = tree(stack.spans(trace_id))["tool_calls"]
    assert call.attributes[names.ATTR_REJECTION_REASON] == "missing_arguments"
    assert [s.name for s in stack.spans(trace_id) if s.name == names.SPAN_TOOL_EXECUTE] == []
    assert stack.metric(names.METRIC_TOOL_REJECTIONS, tool="read_file", reason="missing_arguments") == 1


@pytest.mark.parametrize("route", ["invoke", "parse"])
async def test_unknown_tool_is_a_404(stack: Stack, route: str) -> None:
    status, body, trace_id = await invoke(stack, "read_fiel", {"arguments": {"path": "a"}}, route)
    assert status == 404
    assert body == {"error": {"message": "there is no tool named 'read_fiel'", "type": "not_found_error",
                              "param": "name", "code": "unknown_tool"}}
    # A caller's wrong URL is an HTTP error, not a model's tool call: no tool.call span, no tool metrics.
    assert tool_call_spans(stack, trace_id) == []
    assert stack.metric(names.METRIC_TOOL_CALLS, tool=names.UNKNOWN_TOOL, outcome="rejected") == 0
    assert server_span(stack, trace_id).attributes[names.ATTR_HTTP_STATUS] == 404  # type: ignore[index]


@pytest.mark.parametrize("route", ["invoke", "parse"])
@pytest.mark.parametrize("arguments", [[1, 2], 3, True, None], ids=["list", "number", "bool", "null"])
async def test_arguments_that_are_not_an_object_are_a_400(stack: Stack, route: str, arguments: Any) -> None:
    status, body, trace_id = await invoke(stack, "add", {"arguments": arguments}, route)
    assert status == 400
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["param"] == "arguments"
    assert tool_call_spans(stack, trace_id) == []


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]"], ids=["broken", "array"])
async def test_invoke_body_that_is_not_a_json_object_is_a_400(stack: Stack, raw: bytes) -> None:
    async with stack.http.post("/v1/tools/add/invoke", data=raw,
                               headers={"Content-Type": "application/json"}) as response:
        assert response.status == 400
        body = await response.json()
    assert body["error"]["code"] == "invalid_json"


async def test_arguments_text_that_is_not_an_object_is_a_rejection(stack: Stack) -> None:
    status, body, trace_id = await invoke(stack, "add", {"arguments": "[1, 2]"})
    assert status == 200
    assert (body["status"], body["rejection"]) == ("rejected", {"reason": "invalid_json"})
    assert len(tool_call_spans(stack, trace_id)) == 1


@pytest.fixture
async def recording(make_stack: StackFactory) -> tuple[Stack, list[dict[str, Any]]]:
    calls: list[dict[str, Any]] = []

    def record(args: dict[str, Any]) -> str:
        calls.append(args)
        return "recorded"

    registry = ToolRegistry([Tool(name="book", description="Book a trip", function=record,
                                  parameters=[Param("city", "string", required=True), Param("nights", "integer")])])
    return await make_stack(registry=registry), calls


async def test_parse_is_a_dry_run(recording: tuple[Stack, list[dict[str, Any]]]) -> None:
    stack, calls = recording
    status, body, trace_id = await invoke(stack, "book", {"arguments": {"city": "Oslo", "nights": 2}}, "parse")
    assert status == 200
    assert body == {"valid": True, "arguments": {"city": "Oslo", "nights": 2}}
    assert calls == []
    assert tool_call_spans(stack, trace_id) == []
    # The same arguments through invoke do run the body: the dry run really was one.
    status, body, _ = await invoke(stack, "book", {"arguments": {"city": "Oslo", "nights": 2}})
    assert (status, body["status"], body["content"]) == (200, "ok", "recorded")
    assert calls == [{"city": "Oslo", "nights": 2}]


async def test_parse_reports_a_bad_call(recording: tuple[Stack, list[dict[str, Any]]]) -> None:
    stack, calls = recording
    status, body, _ = await invoke(stack, "book", {"arguments": {"city_name": "Oslo"}}, "parse")
    assert status == 200
    assert body["valid"] is False
    assert body["reason"] == "missing_arguments"
    assert "Missing: city" in body["message"]
    assert "city_name (did you mean 'city'?)" in body["message"]
    assert set(body) == {"valid", "reason", "message"}
    assert calls == []


# --- metrics and health ----------------------------------------------------------------------------

async def test_metrics_default_to_prometheus_text(stack: Stack) -> None:
    await invoke(stack, "add", {"arguments": {"a": 1, "b": 2}})
    async with stack.http.get("/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await response.text()
    assert f"# TYPE {names.METRIC_REQUESTS} counter" in text
    assert f'{names.METRIC_TOOL_CALLS}{{outcome="ok",side="gateway",tool="add"}} 1.0' in text
    assert "# {" not in text  # exemplars only in OpenMetrics
    assert "# EOF" not in text


async def test_openmetrics_carries_the_trace_id_exemplar(stack: Stack) -> None:
    _, _, trace_id = await invoke(stack, "add", {"arguments": {"a": 1, "b": 2}})
    async with stack.http.get("/metrics", headers={"Accept": OPENMETRICS}) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
        text = await response.text()
    assert text.endswith("# EOF\n")
    exemplars = re.findall(
        rf'^{names.METRIC_TOOL_CALL_DURATION}_bucket\{{[^}}]*tool="add"[^}}]*\}} \S+ # \{{trace_id="([0-9a-f]+)"\}}',
        text, re.MULTILINE)
    assert exemplars == [trace_id]


async def test_requests_are_counted_by_route(stack: Stack) -> None:
    for _ in range(2):
        async with stack.http.get("/v1/tools") as response:
            assert response.status == 200
    await invoke(stack, "add", {"arguments": {"a": 1, "b": 2}})
    await invoke(stack, "nope", {"arguments": {}})
    async with stack.http.get("/v1/nothing/here") as response:
        assert response.status == 404
    assert stack.metric(names.METRIC_REQUESTS, route="/v1/tools", status="200") == 2
    assert stack.metric(names.METRIC_REQUESTS, route="/v1/tools/{name}/invoke", status="200") == 1
    assert stack.metric(names.METRIC_REQUESTS, route="/v1/tools/{name}/invoke", status="404") == 1
    assert stack.metric(names.METRIC_REQUESTS, route="/v1/{tail}", status="404") == 1  # the pattern, not the path
    assert stack.metric(names.METRIC_REQUESTS_IN_FLIGHT) == 0


@pytest.mark.parametrize(("path", "expected"), [("/healthz", {"status": "ok"}), ("/readyz", {"status": "ready"})])
async def test_health(stack: Stack, path: str, expected: dict[str, str]) -> None:
    async with stack.http.get(path) as response:
        assert response.status == 200
        assert response.content_type == "application/json"
        assert await response.json() == expected


# --- the provider key ------------------------------------------------------------------------------

@pytest.mark.parametrize(("key", "seen"), [(None, "Bearer sk-test-key"), ("sk-provider", "Bearer sk-provider")],
                         ids=["caller-key", "provider-key"])
async def test_which_key_reaches_the_provider(make_stack: StackFactory, key: str | None, seen: str) -> None:
    stack = await make_stack(upstream_api_key=key)
    stack.script.then(Reply(content="hi"))
    await stack.client.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
    [headers] = stack.model.request_headers
    assert headers["Authorization"] == seen
    if key is not None:
        assert not any("sk-test" in value for value in headers.values())


async def test_provider_key_never_leaks(make_stack: StackFactory) -> None:
    secret = "sk-provider-0123456789"
    stack = await make_stack(upstream_api_key=secret)
    stack.script.then(Reply(tool_calls=[("read_file", {"file_path": "x"})]), Reply(content="hi"),
                      Reply(status=401, error="bad key"))
    seen: list[bytes] = []

    async def fetch(method: str, path: str, accept: str = "*/*", **kwargs: Any) -> None:
        headers = {"Authorization": "Bearer sk-caller", "Accept": accept}
        async with stack.http.request(method, path, headers=headers, **kwargs) as response:
            seen.append(await response.read())
            seen.append(json.dumps(dict(response.headers)).encode())

    chat = {"model": "m", "messages": USER}
    await fetch("POST", "/v1/chat/completions", json=chat)  # a rejected tool call, then an answer
    await fetch("POST", "/v1/chat/completions", json=chat)  # the provider's 401, passed on
    await fetch("GET", "/v1/models")
    await fetch("POST", "/v1/echo", data=b"hello")
    await fetch("GET", "/v1/tools")
    await fetch("POST", "/v1/tools/read_file/invoke", json={"arguments": {"path": "a"}})
    await fetch("GET", "/metrics", accept=OPENMETRICS)
    assert b"bad key" in seen[2]  # the refusal did come back
    assert all(secret.encode() not in part for part in seen)
    assert [h["Authorization"] for h in stack.model.request_headers] == [f"Bearer {secret}"] * 3
    spans = stack.spans()
    assert {s.name for s in spans} >= {names.SPAN_TOOL_CALL, "chat m", "POST /v1/chat/completions"}
    for span in spans:
        for value in (span.attributes or {}).values():
            assert secret not in str(value), span.name


async def test_the_builtin_model_remembers_only_its_last_requests(aiohttp_client: AiohttpClient) -> None:
    """`toolspan serve` can run the built-in model for days: what it keeps must not grow."""
    model = ScriptedModel(FastPolicy(), keep=2)
    http = await aiohttp_client(model.app())
    for n in range(3):
        body = {"model": "m", "messages": [{"role": "user", "content": f"question {n}"}]}
        async with http.post("/v1/chat/completions", json=body) as response:
            assert response.status == 200
    assert [r["messages"][0]["content"] for r in model.requests] == ["question 1", "question 2"]
    assert len(model.request_headers) == 2


@pytest.mark.parametrize("path", ["/v1/tools", "/v1/models", "/healthz", "/ui"])
async def test_an_expectation_other_than_100_continue_is_an_openai_shaped_417(stack: Stack, path: str) -> None:
    """aiohttp answers an unknown `Expect` in plain text, before any middleware; the gateway's own
    handler answers it in OpenAI's shape, on every route."""
    async with stack.http.get(path, headers={"Expect": "~'M"}) as response:
        assert response.status == 417
        assert (await response.json())["error"]["code"] == "expectation_failed"


async def test_100_continue_is_still_met(stack: Stack) -> None:
    stack.script.then(Reply(content="hello"))
    async with stack.http.post("/v1/chat/completions", headers={"Expect": "100-continue"},
                               json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}) as response:
        assert response.status == 200
        assert (await response.json())["choices"][0]["message"]["content"] == "hello"
