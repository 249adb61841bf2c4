"""Faithful to real providers and real clients: provider fields and headers reach the client, the
caller's headers and query reach the provider, the gateway's own fields do not, tools that pause
hand the call to the client, provider errors keep their message, and Azure-style providers and
clients work."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.demo.model import Reply
from gateway.tools import Interrupt, Param, Tool, ToolRegistry
from telemetry import names
from tests.conftest import STREAM, USER, Stack, StackFactory, sample_registry, tree

RATE = {"x-request-id": "req_123", "x-ratelimit-remaining-requests": "99", "openai-processing-ms": "42"}


def sse(*events: dict[str, Any], done: bool = True) -> bytes:
    """A recorded stream: these events, as a provider writes them."""
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return body + (b"data: [DONE]\n\n" if done else b"")


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": extra.pop("logprobs", None), "finish_reason": finish}
    return {"id": "chatcmpl-rec", "object": "chat.completion.chunk", "created": 1, "model": "gpt-rec",
            "system_fingerprint": "fp_rec", "service_tier": "default", "choices": [choice], **extra}


LOGPROBS = {"content": [{"token": "Hi", "logprob": -0.1, "bytes": [72, 105], "top_logprobs": []}], "refusal": None}


# --- pass-through fidelity -------------------------------------------------------------------------

async def test_a_stream_keeps_the_providers_fields(stack: Stack) -> None:
    stack.script.then(Reply(raw_stream=sse(
        chunk({"role": "assistant", "content": "", "reasoning_content": "Thinking"}),
        chunk({"content": "Hi"}, logprobs=LOGPROBS),
        chunk({}, "stop"),
        {**chunk({}), "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})))
    raw = await stack.client.chat.completions.with_raw_response.create(
        model="m", messages=USER, stream=True, stream_options={"include_usage": True})
    chunks = [c.model_dump() async for c in raw.parse()]
    assert all(c["system_fingerprint"] == "fp_rec" and c["service_tier"] == "default" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["reasoning_content"] == "Thinking"  # type: ignore[index]
    assert chunks[1]["choices"][0]["logprobs"] == LOGPROBS
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]] == [None, None, "stop"]
    assert chunks[-1]["usage"]["total_tokens"] == 4


@STREAM
async def test_provider_headers_reach_the_client(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(content="Hi", headers=RATE))
    answer = await stack.ask(stream, messages=USER)
    assert {k: answer.headers.get(k) for k in RATE} == RATE


@STREAM
async def test_provider_headers_reach_the_client_with_its_error(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(status=429, error="slow down", headers={**RATE, "retry-after": "3"}))
    with pytest.raises(openai.RateLimitError) as caught:
        await stack.ask(stream, messages=USER)
    assert caught.value.response.headers["x-request-id"] == "req_123"
    assert caught.value.response.headers["retry-after"] == "3"


async def test_the_callers_headers_and_query_reach_the_provider(stack: Stack) -> None:
    stack.script.then(Reply(content="Hi"))
    sent = {"OpenAI-Organization": "org-1", "OpenAI-Project": "proj-1", "baggage": "tenant=acme",
            "X-Custom": "kept", "Authorization": "Bearer sk-caller", "Cookie": "session=1"}
    response = await stack.http.post("/v1/chat/completions?api-version=2024-10-21&x=1", headers=sent,
                                      json={"model": "m", "messages": USER})
    assert response.status == 200
    headers = {k.lower(): v for k, v in stack.model.request_headers[-1].items()}
    assert stack.model.request_paths[-1] == "/v1/chat/completions?api-version=2024-10-21&x=1"
    for name in ("openai-organization", "openai-project", "x-custom", "authorization"):
        assert headers[name] == {k.lower(): v for k, v in sent.items()}[name]
    assert "tenant=acme" in headers["baggage"]
    assert "cookie" not in headers
    assert "x-trajectory-id" not in headers


async def test_the_callers_credentials_stay_behind_when_the_gateway_has_its_own_key(make_stack: StackFactory) -> None:
    stack = await make_stack(upstream_api_key="sk-operator")
    stack.script.then(Reply(content="Hi"))
    sent = {"OpenAI-Organization": "org-caller", "OpenAI-Project": "proj-caller", "api-key": "caller",
            "Authorization": "Bearer sk-caller", "X-Custom": "kept"}
    response = await stack.http.post("/v1/chat/completions", headers=sent, json={"model": "m", "messages": USER})
    assert response.status == 200
    headers = {k.lower(): v for k, v in stack.model.request_headers[-1].items()}
    assert headers["authorization"] == "Bearer sk-operator"
    assert headers["x-custom"] == "kept"
    assert not {"openai-organization", "openai-project", "api-key"} & set(headers)


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize(("metadata", "forwarded"), [({"trajectory_id": "run-7"}, None),
                                                     ({"trajectory_id": "run-7", "team": "a"}, {"team": "a"})],
                         ids=["only-ours", "ours-and-theirs"])
async def test_the_gateways_own_request_fields_stay_behind(stack: Stack, api: str, metadata: dict[str, Any],
                                                           forwarded: dict[str, Any] | None) -> None:
    stack.script.then(Reply(content="Hi"))
    if api == "chat":
        answer_headers = (await stack.ask(False, messages=USER, metadata=metadata)).headers
    else:
        answer_headers = (await stack.respond(False, input="hi", metadata=metadata)).headers
    assert answer_headers["x-trajectory-id"] == "run-7"  # still read by the gateway
    assert stack.upstream_requests[-1].get("metadata") == forwarded


async def test_legacy_functions_are_checked_for_clashes(stack: Stack) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await stack.client.chat.completions.create(model="m", messages=USER,  # type: ignore[call-overload]
                                                   functions=[{"name": "read_file", "parameters": {}}])
    assert caught.value.param == "functions"
    assert stack.upstream_requests == []


# --- provider errors ----------------------------------------------------------------------------------

@STREAM
async def test_a_provider_5xx_keeps_its_message(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(status=503, error="The engine is currently overloaded", headers=RATE))
    with pytest.raises(openai.APIStatusError) as caught:
        await stack.ask(stream, messages=USER)
    assert caught.value.status_code == 502
    assert "The engine is currently overloaded" in caught.value.message
    assert caught.value.response.headers["x-request-id"] == "req_123"


@STREAM
async def test_a_provider_failure_is_logged_once_with_its_trace(stack: Stack, stream: bool,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    stack.script.then(Reply(status=503, error="overloaded"))
    with caplog.at_level(logging.INFO, logger="toolspan.upstream"), pytest.raises(openai.APIStatusError) as caught:
        await stack.ask(stream, messages=USER)
    [record] = [r for r in caplog.records if r.name == "toolspan.upstream"]
    assert record.levelno == logging.WARNING
    assert "overloaded" in record.getMessage()
    assert caught.value.response.headers["x-trace-id"] in record.getMessage()


@pytest.mark.parametrize("status", [400, 500])
async def test_a_plain_text_provider_error_is_wrapped_in_the_openai_shape(stack: Stack, status: int) -> None:
    stack.script.then(Reply(status=status, raw=b"upstream says no", raw_type="text/plain"))
    response = await stack.http.post("/v1/chat/completions", json={"model": "m", "messages": USER})
    assert response.status == (status if status < 500 else 502)
    assert response.content_type == "application/json"
    error = (await response.json())["error"]
    assert "upstream says no" in error["message"]
    assert set(error) == {"message", "type", "param", "code"}


# --- a tool that pauses, in hand-back mode (waiting for a reviewer is tests/e2e/test_approvals.py's) -----

def review(args: dict[str, Any]) -> str:
    raise Interrupt("A person must approve this transfer.", {"amount": args["amount"], "ticket": "T-9"})


def paying_registry() -> ToolRegistry:
    return ToolRegistry([*sample_registry(), Tool(name="transfer", function=review, description="Move money",
                                                  parameters=[Param("amount", "number", required=True)])])


@STREAM
async def test_an_interrupt_hands_the_call_to_the_chat_client_and_its_answer_resumes(make_stack: StackFactory,
                                                                                     stream: bool) -> None:
    stack = await make_stack(registry=paying_registry(), interrupt_mode="hand_back")
    def answer(body: dict[str, Any]) -> Reply:
        return Reply(content=f"Done: {[m['content'] for m in body['messages'] if m['role'] == 'tool']}")

    stack.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 2}), ("transfer", {"amount": 5})]), answer)
    first = await stack.ask(stream, messages=USER)
    assert first.finish_reason == "tool_calls"
    [call] = first.tool_calls
    assert call["function"]["name"] == "transfer"
    assert call["id"].startswith("tspan_")
    if not stream:  # the stream assembles only the standard fields; the extension is checked raw below
        assert call["toolspan_interrupt"] == {"message": "A person must approve this transfer.",
                                              "data": {"amount": 5, "ticket": "T-9"}}
    found = tree(stack.spans(first.headers["x-trace-id"]))
    assert [(s.attributes or {})[names.ATTR_OUTCOME] for s in found["tool_calls"]] == ["ok", "interrupted"]
    messages = [*USER, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call["id"], "content": "approved"}]
    second = await stack.ask(stream, messages=messages)
    assert second.content == "Done: ['3', 'approved']"  # the gateway's result held, the client's added


async def test_an_interrupt_in_a_stream_carries_its_pause(make_stack: StackFactory) -> None:
    stack = await make_stack(registry=paying_registry(), interrupt_mode="hand_back")
    stack.script.then(Reply(tool_calls=[("transfer", {"amount": 5})]))
    response = await stack.http.post("/v1/chat/completions", json={"model": "m", "messages": USER, "stream": True})
    events = [json.loads(line[6:]) for line in (await response.text()).splitlines() if line.startswith("data: {")]
    [call] = [part for e in events for c in e["choices"] for part in c["delta"].get("tool_calls", [])]
    assert call["toolspan_interrupt"]["data"] == {"amount": 5, "ticket": "T-9"}


@STREAM
async def test_an_interrupt_hands_the_call_to_the_responses_client_and_its_answer_resumes(make_stack: StackFactory,
                                                                                          stream: bool) -> None:
    stack = await make_stack(registry=paying_registry(), interrupt_mode="hand_back")
    stack.script.then(Reply(tool_calls=[("transfer", {"amount": 5})]),
                      lambda body: Reply(content=f"Done: {body['messages'][-1]['content']}"))
    first = await stack.respond(stream, input="pay", store=False)
    [call] = first.calls
    assert call["name"] == "transfer"
    assert call["toolspan_interrupt"]["data"] == {"amount": 5, "ticket": "T-9"}
    follow = [{"role": "user", "content": "pay"}, *first.output,
              {"type": "function_call_output", "call_id": call["call_id"], "output": "approved"}]
    second = await stack.respond(stream, input=follow, store=False)
    assert second.text == "Done: approved"


async def test_invoke_returns_the_pause_and_its_data(make_stack: StackFactory) -> None:
    stack = await make_stack(registry=paying_registry(), interrupt_mode="hand_back")
    response = await stack.http.post("/v1/tools/transfer/invoke", json={"arguments": {"amount": 5}})
    body = await response.json()
    assert (body["status"], body["content"]) == ("interrupted", "A person must approve this transfer.")
    assert body["interrupt_data"] == {"amount": 5, "ticket": "T-9"}


# --- Azure OpenAI ---------------------------------------------------------------------------------------

@STREAM
async def test_an_azure_upstream_through_the_azure_client(make_stack: StackFactory, stream: bool) -> None:
    stack = await make_stack(upstream_kind="azure", upstream_api_key="azure-secret", azure_api_version="2024-10-21")
    stack.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 2})]), Reply(content="3"))
    client = openai.AsyncAzureOpenAI(azure_endpoint=stack.url, api_version="2024-10-21", api_key="unused",
                                     max_retries=0)
    async with client:
        answer = await client.chat.completions.create(model="my-deployment", messages=USER, stream=stream)
        if stream:
            text = "".join([c.choices[0].delta.content or "" async for c in answer if c.choices])
        else:
            text = answer.choices[0].message.content or ""
    assert text == "3"
    path = "/openai/deployments/my-deployment/chat/completions?api-version=2024-10-21"
    assert stack.model.request_paths == [path, path]
    headers = {k.lower(): v for k, v in stack.model.request_headers[-1].items()}
    assert headers["api-key"] == "azure-secret"
    assert "authorization" not in headers


async def test_azure_responses_through_the_azure_client(make_stack: StackFactory) -> None:
    stack = await make_stack(upstream_kind="azure", upstream_api_key="azure-secret")
    stack.script.then(Reply(content="Hi"))
    async with openai.AsyncAzureOpenAI(azure_endpoint=stack.url, api_version="2025-03-01-preview",
                                       api_key="unused", max_retries=0) as client:
        response = await client.responses.create(model="my-deployment", input="hello")
    assert response.output_text == "Hi"
    # the surface the client addressed (the dated one, as this client does), with its api-version
    assert stack.model.request_paths[-1] == "/openai/responses?api-version=2025-03-01-preview"
    assert stack.upstream_requests[-1]["model"] == "my-deployment"


async def test_the_provider_name_follows_the_upstream_kind(make_stack: StackFactory) -> None:
    stack = await make_stack(upstream_kind="azure", upstream_provider_name="azure.ai.openai")
    stack.script.then(Reply(content="Hi"))
    answer = await stack.ask(False, messages=USER)
    [chat] = tree(stack.spans(answer.headers["x-trace-id"]))["chat"]
    assert (chat.attributes or {})[names.ATTR_PROVIDER_NAME] == "azure.ai.openai"


# --- review findings: each failed before its fix ----------------------------------------------------------

CORS = {"Access-Control-Allow-Origin": "*", "Access-Control-Allow-Headers": "authorization", "Alt-Svc": "h3=\":443\"",
        "Strict-Transport-Security": "max-age=1"}


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_the_providers_browser_and_transport_policy_stays_behind(make_stack: StackFactory, api: str) -> None:
    stack = await make_stack(upstream_api_key="sk-operator")
    stack.script.then(Reply(content="Hi", headers={**CORS, **RATE}))
    body = {"model": "m", "messages": USER} if api == "chat" else {"model": "m", "input": "hi"}
    response = await stack.http.post("/v1/chat/completions" if api == "chat" else "/v1/responses", json=body)
    names_back = {k.lower() for k in response.headers}
    assert "x-request-id" in names_back
    assert not {n for n in names_back if n.startswith("access-control-")}
    assert not {"alt-svc", "strict-transport-security"} & names_back


async def test_a_preflight_is_answered_by_the_gateway_not_sent_on(make_stack: StackFactory) -> None:
    """From a page the operator allowed (any other page's preflight is refused, 403, with the request)."""
    stack = await make_stack(upstream_api_key="sk-operator", allowed_origins=["https://app.example"])
    response = await stack.http.options("/v1/chat/completions", headers={"Origin": "https://app.example",
                                                                         "Access-Control-Request-Method": "POST"})
    assert response.status == 204
    assert not [k for k in response.headers if k.lower().startswith("access-control-")]
    assert stack.model.request_paths == []


async def test_headers_the_connection_header_names_are_hop_by_hop(stack: Stack) -> None:
    stack.script.then(Reply(content="Hi"))
    await stack.http.post("/v1/chat/completions", json={"model": "m", "messages": USER},
                          headers={"Connection": "keep-alive, X-Hop", "X-Hop": "secret", "X-Kept": "yes"})
    headers = {k.lower() for k in stack.model.request_headers[-1]}
    assert "x-kept" in headers
    assert "x-hop" not in headers


async def test_an_azure_resource_gets_passed_on_requests_on_its_own_routes(make_stack: StackFactory) -> None:
    stack = await make_stack(upstream_kind="azure", upstream_api_key="azure-secret")
    models = await stack.http.get("/v1/models")
    assert models.headers["X-Echo-Path"] == "/openai/v1/models"
    async with openai.AsyncAzureOpenAI(azure_endpoint=stack.url, api_version="2024-10-21", api_key="unused",
                                       max_retries=0) as client:
        raw = await client.embeddings.with_raw_response.create(model="embedder", input="hello")
    assert raw.headers["X-Echo-Path"] == "/openai/deployments/embedder/embeddings?api-version=2024-10-21"


async def test_a_model_that_would_leave_the_deployment_path_is_a_400(make_stack: StackFactory) -> None:
    stack = await make_stack(upstream_kind="azure", upstream_api_key="azure-secret")
    response = await stack.http.post("/v1/chat/completions", json={"model": "..", "messages": USER})
    assert response.status == 400
    assert (await response.json())["error"]["param"] == "model"
    assert stack.model.request_paths == []


@pytest.mark.parametrize("functions", [5, True, "read_file"])
async def test_functions_of_the_wrong_shape_are_a_400(stack: Stack, functions: Any) -> None:
    response = await stack.http.post("/v1/chat/completions",
                                     json={"model": "m", "messages": USER, "functions": functions})
    assert response.status == 400
    assert (await response.json())["error"]["param"] == "functions"


async def test_the_callers_stream_options_reach_the_provider(stack: Stack) -> None:
    stack.script.then(Reply(content="Hi"))
    await stack.http.post("/v1/chat/completions", json={
        "model": "m", "messages": USER, "stream": True,
        "stream_options": {"include_obfuscation": False, "continuous_usage_stats": True}})
    assert stack.upstream_requests[-1]["stream_options"] == {
        "include_obfuscation": False, "continuous_usage_stats": True, "include_usage": True}


async def test_an_azure_stream_names_its_answer_on_the_span(stack: Stack) -> None:
    recorded = (Path(__file__).parent.parent / "corpus" / "azure_content_filter.sse").read_bytes()
    stack.script.then(Reply(raw_stream=recorded))
    response = await stack.http.post("/v1/chat/completions", json={"model": "m", "messages": USER, "stream": True})
    await response.read()
    [chat] = tree(stack.spans(response.headers["X-Trace-Id"]))["chat"]
    attributes = chat.attributes or {}
    assert str(attributes[names.ATTR_RESPONSE_ID]).startswith("chatcmpl-")
    assert attributes[names.ATTR_RESPONSE_MODEL]


async def test_a_pass_through_failure_is_logged_with_its_trace(stack: Stack, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="toolspan.upstream"):
        response = await stack.http.post("/v1/echo", data=b"x", headers={"X-Echo-Status": "503"})
    assert response.status == 502  # a provider's 5xx is the gateway's 502, keeping its message
    [record] = [r for r in caplog.records if r.name == "toolspan.upstream"]
    assert "503" in record.getMessage()
    assert response.headers["X-Trace-Id"] in record.getMessage()


async def test_the_provider_name_follows_the_kind_without_being_named(aiohttp_server: Any) -> None:
    """`toolspan serve` in front of a vLLM server: its spans say so."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from gateway.demo.model import ScriptedModel
    from gateway.runtime.process import gateway
    from gateway.settings.model import Settings
    from tests.conftest import Script

    upstream = await aiohttp_server(ScriptedModel(Script().then(Reply(content="Hi"))).app())
    exporter = InMemorySpanExporter()
    settings = Settings(port=0, upstream=str(upstream.make_url("/v1")), upstream_kind="vllm")
    async with gateway(settings, processors=[SimpleSpanProcessor(exporter)]) as (url, _, _model), \
            openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
        await client.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
    [chat] = [s for s in exporter.get_finished_spans() if s.name.startswith(names.SPAN_CHAT_PREFIX + " ")]
    assert (chat.attributes or {})[names.ATTR_PROVIDER_NAME] == "vllm"
