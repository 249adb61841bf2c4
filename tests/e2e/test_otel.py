"""OpenTelemetry as the standard OTEL_* variables configure it, through the whole gateway: tracing
switched off, a sampler that drops traces, the propagators, and the exemplars linking metrics to
traces. `make_stack` builds its Settings (and so its telemetry) from the environment the test sets."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote_plus

import pytest
from aiohttp import web
from opentelemetry import baggage
from pytest_aiohttp import AiohttpServer

from gateway.demo.model import Reply
from gateway.settings.model import Settings
from gateway.tools import Param, Tool, ToolRegistry
from telemetry import names
from tests.conftest import REMOTE_TRACE, STREAM, TRACEPARENT, USER, GatewayFactory, Stack, StackFactory, add

OPENMETRICS = "application/openmetrics-text; version=1.0.0"
TRACESTATE = "vendor=opaque-value"
BAGGAGE = "tenant=acme,user.id=u%2042"
TRACE_CONTEXT = ("traceparent", "tracestate", "baggage")


def lowered(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def trace_headers(headers: Mapping[str, str]) -> dict[str, Any]:
    """The trace context headers among `headers`, by lower-case name; the baggage decoded, as its
    encoding may change on the way (the SDK writes a space as `+`)."""
    found: dict[str, Any] = {k: v for k, v in lowered(headers).items() if k in TRACE_CONTEXT}
    if "baggage" in found:
        found["baggage"] = dict(tuple(unquote_plus(part).split("=", 1)) for part in found["baggage"].split(","))
    return found


async def exemplars(stack: Stack) -> list[tuple[str, str]]:
    """(metric, trace id) of every exemplar on the OpenMetrics page."""
    async with stack.http.get("/metrics", headers={"Accept": OPENMETRICS}) as response:
        assert response.status == 200
        text = await response.text()
    found: list[tuple[str, str]] = re.findall(
        r'^(\w+)_bucket\{[^}]*\} \S+ # \{trace_id="([0-9a-f]+)"\}', text, re.MULTILINE)
    assert len(found) == text.count(" # {")  # every exemplar on the page is a duration's trace id
    return found


def requests_counted(stack: Stack, status: str = "200") -> float:
    return stack.metric(names.METRIC_REQUESTS, route="/v1/chat/completions", status=status)


def one_tool_round(stack: Stack) -> None:
    """Two provider calls with a gateway tool call between them."""
    stack.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 2})]), Reply(content="3"))


@pytest.fixture
def clean_otel_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No OTEL_* variable of the machine running the tests; the test sets its own."""
    for name in ("OTEL_SDK_DISABLED", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "OTEL_PROPAGATORS",
                 "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


# --- tracing off -------------------------------------------------------------------------------------

@STREAM
async def test_sdk_disabled_sends_no_trace_context_and_no_trace_id(
        make_stack: StackFactory, clean_otel_env: pytest.MonkeyPatch, stream: bool) -> None:
    clean_otel_env.setenv("OTEL_SDK_DISABLED", "true")
    stack = await make_stack()
    one_tool_round(stack)
    answer = await stack.ask(stream, messages=USER)
    assert answer.content == "3"
    assert [trace_headers(h) for h in stack.model.request_headers] == [{}, {}]
    assert "x-trace-id" not in lowered(answer.headers)
    assert stack.spans() == []
    assert requests_counted(stack) == 1  # metrics do not depend on the tracing SDK
    assert await exemplars(stack) == []


async def test_sdk_disabled_hands_the_callers_trace_context_on(
        make_stack: StackFactory, clean_otel_env: pytest.MonkeyPatch) -> None:
    clean_otel_env.setenv("OTEL_SDK_DISABLED", "true")
    stack = await make_stack()
    one_tool_round(stack)
    sent = {"traceparent": TRACEPARENT, "tracestate": TRACESTATE, "baggage": BAGGAGE}
    answer = await stack.ask(False, messages=USER, extra_headers=sent)
    assert answer.headers["x-trace-id"] == REMOTE_TRACE
    assert [trace_headers(h) for h in stack.model.request_headers] == [trace_headers(sent)] * 2
    assert await exemplars(stack) == []  # the caller's trace holds none of the gateway's spans


async def test_sdk_disabled_keeps_other_routes_free_of_trace_ids(
        make_stack: StackFactory, clean_otel_env: pytest.MonkeyPatch) -> None:
    clean_otel_env.setenv("OTEL_SDK_DISABLED", "true")
    stack = await make_stack()
    for method, path, body in (("GET", "/healthz", None), ("POST", "/v1/tools/add/invoke", {"arguments": {"a": 1,
                                                                                                          "b": 2}})):
        async with stack.http.request(method, path, json=body) as response:
            assert response.status == 200
            assert "X-Trace-Id" not in response.headers


async def test_telemetry_off_names_only_the_callers_trace(make_stack: StackFactory) -> None:
    stack = await make_stack(telemetry=False)
    async with stack.http.get("/healthz") as response:
        assert response.status == 200
        assert "X-Trace-Id" not in response.headers  # no trace: no made-up id
    async with stack.http.get("/healthz", headers={"traceparent": TRACEPARENT}) as response:
        assert response.headers["X-Trace-Id"] == REMOTE_TRACE


@pytest.mark.parametrize("traceparent", ["garbage", f"00-{'0' * 32}-00f067aa0ba902b7-01",
                                         f"00-{REMOTE_TRACE}-{'0' * 16}-01", f"ff-{REMOTE_TRACE}-00f067aa0ba902b7-01"],
                         ids=["garbage", "zero-trace", "zero-span", "version-ff"])
async def test_telemetry_off_ignores_an_invalid_traceparent(make_stack: StackFactory, traceparent: str) -> None:
    stack = await make_stack(telemetry=False)
    async with stack.http.get("/healthz", headers={"traceparent": traceparent}) as response:
        assert "X-Trace-Id" not in response.headers


# --- sampling ----------------------------------------------------------------------------------------

@STREAM
async def test_a_dropped_trace_still_propagates_but_gets_no_exemplar(
        make_stack: StackFactory, clean_otel_env: pytest.MonkeyPatch, stream: bool) -> None:
    clean_otel_env.setenv("OTEL_TRACES_SAMPLER", "always_off")
    stack = await make_stack()
    one_tool_round(stack)
    answer = await stack.ask(stream, messages=USER)
    trace_id = answer.headers["x-trace-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", trace_id)
    assert trace_id != "0" * 32
    for headers in stack.model.request_headers:
        version, trace, _span, flags = headers["traceparent"].split("-")
        assert (version, trace) == ("00", trace_id)
        assert int(flags, 16) & 1 == 0  # a valid context, not sampled
    assert stack.spans() == []
    assert requests_counted(stack) == 1
    assert stack.metric(names.METRIC_TOOL_CALLS, tool="add", outcome="ok") == 1
    assert await exemplars(stack) == []  # no exemplar pointing at a trace nobody kept


async def test_sampled_requests_get_exemplars_of_their_own_trace(
        make_stack: StackFactory, clean_otel_env: pytest.MonkeyPatch) -> None:
    stack = await make_stack()
    one_tool_round(stack)
    answer = await stack.ask(False, messages=USER)
    found = await exemplars(stack)
    assert {metric for metric, _ in found} == {names.METRIC_REQUEST_DURATION, names.METRIC_UPSTREAM_DURATION,
                                               names.METRIC_TOOL_CALL_DURATION}
    assert {trace_id for _, trace_id in found} == {answer.headers["x-trace-id"]}


async def test_a_caller_that_did_not_sample_gets_no_exemplar(
        make_stack: StackFactory, clean_otel_env: pytest.MonkeyPatch) -> None:
    stack = await make_stack()  # the default sampler follows the caller's decision
    one_tool_round(stack)
    answer = await stack.ask(False, messages=USER, extra_headers={"traceparent": TRACEPARENT[:-2] + "00"})
    assert answer.headers["x-trace-id"] == REMOTE_TRACE
    assert await exemplars(stack) == []


# --- propagators -------------------------------------------------------------------------------------

def baggage_registry(seen: list[dict[str, object]]) -> ToolRegistry:
    """`add`, and `whoami`, which records the baggage its body runs under."""
    def whoami(args: dict[str, Any]) -> str:
        seen.append(dict(baggage.get_all()))
        return "ok"

    return ToolRegistry([Tool(name="add", function=add, parameters=[Param("a", "number", required=True),
                                                                    Param("b", "number", required=True)]),
                         Tool(name="whoami", function=whoami)])


@pytest.mark.parametrize("propagators", [None, "tracecontext,baggage", " TraceContext , Baggage "])
async def test_w3c_trace_context_and_baggage_by_default(
        make_stack: StackFactory, clean_otel_env: pytest.MonkeyPatch, propagators: str | None) -> None:
    if propagators is not None:
        clean_otel_env.setenv("OTEL_PROPAGATORS", propagators)
    seen: list[dict[str, object]] = []
    stack = await make_stack(registry=baggage_registry(seen))
    stack.script.then(Reply(tool_calls=[("whoami", {})]), Reply(content="done"))
    answer = await stack.ask(False, messages=USER, extra_headers={"traceparent": TRACEPARENT, "baggage": BAGGAGE})
    assert answer.headers["x-trace-id"] == REMOTE_TRACE
    assert seen == [{"tenant": "acme", "user.id": "u 42"}]  # the caller's baggage is the request's context
    for headers in stack.model.request_headers:
        sent = trace_headers(headers)
        assert sent["traceparent"].split("-")[1] == REMOTE_TRACE
        assert sent["baggage"] == {"tenant": "acme", "user.id": "u 42"}


async def test_baggage_alone_writes_no_traceparent(make_stack: StackFactory,
                                                   clean_otel_env: pytest.MonkeyPatch) -> None:
    clean_otel_env.setenv("OTEL_PROPAGATORS", "baggage")
    seen: list[dict[str, object]] = []
    stack = await make_stack(registry=baggage_registry(seen))
    stack.script.then(Reply(tool_calls=[("whoami", {})]), Reply(content="done"))
    answer = await stack.ask(False, messages=USER, extra_headers={"baggage": BAGGAGE})
    assert seen == [{"tenant": "acme", "user.id": "u 42"}]
    assert "x-trace-id" in answer.headers  # the gateway still traces; it only does not say so upstream
    assert [set(trace_headers(h)) for h in stack.model.request_headers] == [{"baggage"}, {"baggage"}]


async def test_no_propagators_write_no_trace_context(make_stack: StackFactory,
                                                     clean_otel_env: pytest.MonkeyPatch) -> None:
    clean_otel_env.setenv("OTEL_PROPAGATORS", "none")
    stack = await make_stack()
    one_tool_round(stack)
    answer = await stack.ask(False, messages=USER)
    trace_id = answer.headers["x-trace-id"]
    assert stack.spans(trace_id)  # traced, just not propagated
    assert [trace_headers(h) for h in stack.model.request_headers] == [{}, {}]


async def test_no_propagators_ignore_the_callers_trace_context(make_stack: StackFactory,
                                                               clean_otel_env: pytest.MonkeyPatch) -> None:
    clean_otel_env.setenv("OTEL_PROPAGATORS", "none")
    stack = await make_stack()
    async with stack.http.get("/v1/tools", headers={"traceparent": TRACEPARENT}) as response:  # not a probe: traced
        trace_id = response.headers["X-Trace-Id"]
    assert trace_id != REMOTE_TRACE
    [root] = stack.spans(trace_id)
    assert root.parent is None


async def test_an_unknown_propagator_fails_at_start_up(make_stack: StackFactory,
                                                       clean_otel_env: pytest.MonkeyPatch) -> None:
    clean_otel_env.setenv("OTEL_PROPAGATORS", "tracecontext,jaegerish")
    with pytest.raises(ValueError, match="OTEL_PROPAGATORS=tracecontext,jaegerish: jaegerish is not supported"):
        await make_stack()


# --- pass-through routes -----------------------------------------------------------------------------

async def recording_provider(aiohttp_server: AiohttpServer, seen: list[dict[str, str]]) -> str:
    """A provider answering every /v1 request, keeping the headers it got; its base URL."""
    async def answer(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.json_response({"object": "list", "data": []})

    app = web.Application()
    app.router.add_route("*", "/v1/{tail:.*}", answer)
    server = await aiohttp_server(app)
    return str(server.make_url("/v1"))


@pytest.mark.parametrize(("disabled", "sent", "expected"), [
    (True, {}, {}),
    (True, {"traceparent": TRACEPARENT, "baggage": BAGGAGE}, {"traceparent": TRACEPARENT, "baggage": BAGGAGE}),
    (False, {"baggage": BAGGAGE}, {"baggage": BAGGAGE}),  # and a traceparent of the gateway's (checked below)
], ids=["off", "off-callers-context", "on"])
async def test_pass_through_propagates_as_configured(
        make_gateway: GatewayFactory, aiohttp_server: AiohttpServer, clean_otel_env: pytest.MonkeyPatch,
        disabled: bool, sent: dict[str, str], expected: dict[str, str]) -> None:
    if disabled:
        clean_otel_env.setenv("OTEL_SDK_DISABLED", "true")
    seen: list[dict[str, str]] = []
    gateway = await make_gateway(Settings(port=0, upstream=await recording_provider(aiohttp_server, seen)))
    async with gateway.http.get("/v1/models", headers=sent) as response:
        assert response.status == 200
        trace_id = response.headers.get("X-Trace-Id")
    [headers] = seen
    got = trace_headers(headers)
    if disabled:
        assert got == trace_headers(expected)
        assert trace_id == (REMOTE_TRACE if sent else None)
        return
    traceparent = got.pop("traceparent")
    assert got == trace_headers(expected)
    assert traceparent.split("-")[1] == trace_id
