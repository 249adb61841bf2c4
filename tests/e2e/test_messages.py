"""Anthropic's Messages API through the gateway (POST /v1/messages), with Anthropic's own client
against the scripted Messages upstream: plain answers, the gateway's tools in a loop (a renamed
argument refused and corrected), the client's own tools handed back, a turn that calls both,
thinking blocks kept to the byte, usage summed over the rounds, errors in Anthropic's shape, and
its overloaded error (529, or an overloaded_error event) retried after a tool round and kept as such."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import anthropic
import openai
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import SecretStr

from gateway.demo.messages import build_message, message_events, signature
from gateway.demo.model import Reply, ScriptedModel
from gateway.runtime.process import gateway
from gateway.settings.model import Settings
from gateway.settings.parts import GatewayKey
from gateway.state import PREFIX
from gateway.tools import Param, Tool, ToolRegistry
from telemetry import names
from tests.conftest import AUTH, STREAM, Script, Stack, StackFactory, tool_call_spans, tool_outcomes, tree

USER = [{"role": "user", "content": "What is in a.txt, and the weather in Paris?"}]
GET_WEATHER = {"name": "get_weather", "description": "The weather in a city",
               "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@dataclass
class Answer:
    """What Anthropic's client made of the answer, streamed or not."""

    message: dict[str, Any]
    headers: dict[str, str]
    events: list[dict[str, Any]]  # the stream's events as the client read them ([] when not streamed)

    @property
    def text(self) -> str:
        return "".join(block["text"] for block in self.message["content"] if block["type"] == "text")

    @property
    def calls(self) -> list[dict[str, Any]]:
        return [block for block in self.message["content"] if block["type"] == "tool_use"]


async def ask(stack: Stack, stream: bool, client: anthropic.AsyncAnthropic | None = None, **request: Any) -> Answer:
    request.setdefault("model", "claude-test")
    request.setdefault("max_tokens", 512)
    request.setdefault("messages", USER)
    async with client or stack.anthropic() as anthropic_client:
        if not stream:
            raw = await anthropic_client.messages.with_raw_response.create(**request)
            return Answer((await raw.parse()).model_dump(exclude_none=True), dict(raw.headers), [])
        events: list[dict[str, Any]] = []
        async with anthropic_client.messages.stream(**request) as streamed:
            async for event in streamed:
                if event.type in ("message_start", "content_block_start", "content_block_delta",
                                  "content_block_stop", "message_delta", "message_stop"):
                    events.append(event.model_dump(exclude_none=True))
            message = await streamed.get_final_message()
            return Answer(message.model_dump(exclude_none=True), dict(streamed.response.headers), events)


def sent(stack: Stack, index: int = -1) -> dict[str, Any]:
    return stack.upstream_requests[index]


@STREAM
async def test_a_plain_answer_comes_back_as_the_provider_sent_it(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(content="Hello from the model."))
    answer = await ask(stack, stream)
    assert answer.text == "Hello from the model."
    assert (answer.message["stop_reason"], answer.message["id"]) == ("end_turn", "msg_scripted_1")
    assert answer.message["usage"]["input_tokens"] == 10
    assert answer.message["usage"]["output_tokens"] == 5
    assert answer.headers["x-trajectory-id"]
    body = sent(stack)
    assert [t["name"] for t in body["tools"]] == ["read_file", "add"]  # the gateway's, in Anthropic's shape
    assert body["tools"][0]["input_schema"]["required"] == ["path"]
    headers = {k.lower(): v for k, v in stack.model.request_headers[-1].items()}
    async with stack.anthropic() as client:
        assert headers["anthropic-version"] == client.default_headers["anthropic-version"]  # the client's, passed on
    if stream:
        assert next(e["type"] for e in answer.events) == "message_start"
        assert [e["type"] for e in answer.events][-2:] == ["message_delta", "message_stop"]


@STREAM
async def test_the_beta_surface_and_its_headers_reach_the_provider(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(content="beta"))
    async with stack.anthropic() as client:
        request: dict[str, Any] = {"model": "claude-test", "max_tokens": 64, "messages": USER,
                                   "betas": ["interleaved-thinking-2025-05-14"]}
        if stream:
            async with client.beta.messages.stream(**request) as streamed:
                text = "".join([piece async for piece in streamed.text_stream])
        else:
            message = await client.beta.messages.create(**request)
            text = message.content[0].text  # type: ignore[union-attr]
    assert text == "beta"
    headers = {k.lower(): v for k, v in stack.model.request_headers[-1].items()}
    assert headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"


async def test_the_beta_query_claude_code_sends_reaches_the_provider(stack: Stack) -> None:
    stack.script.then(Reply(content="beta"))
    response = await stack.http.post("/v1/messages?beta=true", json={"model": "m", "max_tokens": 5, "messages": USER},
                                     headers={"anthropic-version": "2023-06-01"})
    assert response.status == 200
    assert (await response.json())["content"][0]["text"] == "beta"
    assert stack.model.request_paths[-1] == "/v1/messages?beta=true"


@STREAM
async def test_a_renamed_argument_is_refused_then_corrected_in_one_answer(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(content="Let me look.", tool_calls=[("read_file", {"file_path": "a.txt"})]),
                      Reply(tool_calls=[("read_file", {"path": "a.txt"})]),
                      Reply(content="It says: contents of a.txt"))
    answer = await ask(stack, stream)
    assert answer.text == "Let me look.It says: contents of a.txt"  # every round's text, in one message
    assert answer.calls == []
    assert answer.message["stop_reason"] == "end_turn"
    assert answer.message["id"] == "msg_scripted_1"  # one message, named as its first round
    usage = answer.message["usage"]
    assert (usage["input_tokens"], usage["output_tokens"], usage["cache_read_input_tokens"]) == (30, 15, 0)
    [refused] = sent(stack, 1)["messages"][-1]["content"]
    assert refused["is_error"] is True
    assert "did you mean 'path'?" in refused["content"]
    [result] = sent(stack, 2)["messages"][-1]["content"]
    assert result == {"type": "tool_result", "tool_use_id": "toolu_scripted_2_0", "content": "contents of a.txt"}
    trace = answer.headers["x-trace-id"]
    outcomes = [(s.attributes or {})[names.ATTR_OUTCOME] for s in tool_call_spans(stack, trace)]
    assert outcomes == ["rejected", "ok"]
    chats = tree(stack.spans(trace))["chat"]
    assert len(chats) == 3  # a chat span per round
    assert [(s.attributes or {})[names.ATTR_FINISH_REASONS] for s in chats] == [
        ("tool_calls",), ("tool_calls",), ("stop",)]
    if stream:
        starts = [e for e in answer.events if e["type"] == "content_block_start"]
        assert [e["index"] for e in starts] == [0, 1]  # counted across rounds, the gateway's calls left out
        assert [e["type"] for e in answer.events].count("message_start") == 1
        assert [e["type"] for e in answer.events].count("message_stop") == 1


@STREAM
async def test_the_clients_own_tool_comes_back_and_its_result_goes_on(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(tool_calls=[("get_weather", {"city": "Paris"})]), Reply(content="Sunny in Paris."))
    first = await ask(stack, stream, tools=[GET_WEATHER])
    [call] = first.calls
    assert (call["name"], call["input"], call["id"]) == ("get_weather", {"city": "Paris"}, "toolu_scripted_1_0")
    assert first.message["stop_reason"] == "tool_use"
    messages = [*USER, {"role": "assistant", "content": first.message["content"]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "sunny"}]}]
    second = await ask(stack, stream, tools=[GET_WEATHER], messages=messages)
    assert second.text == "Sunny in Paris."
    assert second.headers["x-trajectory-id"] == first.headers["x-trajectory-id"]  # one run, one trajectory
    assert sent(stack)["messages"][-1]["content"][0]["tool_use_id"] == "toolu_scripted_1_0"
    assert [t["name"] for t in sent(stack)["tools"]] == ["get_weather", "read_file", "add"]


@STREAM
async def test_a_turn_calling_both_sides_is_held_and_put_back(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(content="Both.", tool_calls=[("read_file", {"path": "a.txt"}),
                                                         ("get_weather", {"city": "Paris"})]),
                      Reply(content="a.txt holds contents of a.txt; Paris is sunny."))
    first = await ask(stack, stream, tools=[GET_WEATHER])
    [call] = first.calls  # only the client's; the gateway ran its own
    assert call["name"] == "get_weather"
    assert call["id"].startswith(PREFIX)
    assert call["id"].endswith("_toolu_scripted_1_1")
    assert first.text == "Both."
    messages = [*USER, {"role": "assistant", "content": first.message["content"]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "sunny"}]}]
    second = await ask(stack, stream, tools=[GET_WEATHER], messages=messages)
    assert second.text == "a.txt holds contents of a.txt; Paris is sunny."
    restored = sent(stack)["messages"]  # the scripted provider refuses a tool_use without its tool_result
    assert [b["id"] for b in restored[1]["content"] if b["type"] == "tool_use"] == [
        "toolu_scripted_1_0", "toolu_scripted_1_1"]
    assert restored[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_scripted_1_0", "content": "contents of a.txt"},
        {"type": "tool_result", "tool_use_id": "toolu_scripted_1_1", "content": "sunny"}]


@STREAM
async def test_thinking_blocks_go_back_to_the_provider_byte_for_byte(stack: Stack, stream: bool) -> None:
    thought = "The user wants a.txt. I should call read_file with \"path\" — ünïcödé and all."
    stack.script.then(Reply(reasoning=thought, tool_calls=[("read_file", {"path": "a.txt"})]),
                      Reply(reasoning="Now answer.", content="Done."))
    answer = await ask(stack, stream, thinking={"type": "enabled", "budget_tokens": 1024})
    thinking = [b for b in answer.message["content"] if b["type"] == "thinking"]
    assert thinking == [{"type": "thinking", "thinking": thought, "signature": signature(thought)},
                        {"type": "thinking", "thinking": "Now answer.", "signature": signature("Now answer.")}]
    # The scripted provider checks each signature against its block, as Anthropic does: the second
    # round was accepted, so the block went back unchanged, with the call after it.
    [again] = [b for b in sent(stack)["messages"][1]["content"] if b["type"] == "thinking"]
    assert again == {"type": "thinking", "thinking": thought, "signature": signature(thought)}
    assert sent(stack)["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert answer.text == "Done."


async def test_an_altered_thinking_block_is_the_providers_400_in_anthropics_shape(stack: Stack) -> None:
    messages = [*USER, {"role": "assistant", "content": [{"type": "thinking", "thinking": "x", "signature": "forged"},
                                                         {"type": "text", "text": "hi"}]},
                {"role": "user", "content": "go on"}]
    with pytest.raises(anthropic.BadRequestError) as refused:
        await ask(stack, False, messages=messages)
    assert refused.value.body == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "messages.1.content: Invalid `signature` in `thinking` block"}}


@STREAM
async def test_a_request_the_gateway_refuses_is_an_anthropic_error(stack: Stack, stream: bool) -> None:
    with pytest.raises(anthropic.BadRequestError) as refused:
        await ask(stack, stream, tools=[{**GET_WEATHER, "name": "read_file"}])  # the gateway's tool's name
    assert refused.value.body["type"] == "error"  # type: ignore[index]
    assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "tool 'read_file' is provided by the gateway" in refused.value.body["error"]["message"]  # type: ignore[index]
    response = await stack.http.post("/v1/messages", json={"model": "m", "max_tokens": 5, "messages": []})
    assert response.status == 400
    body = await response.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "messages" in body["error"]["message"]
    assert stack.upstream_requests == []


async def test_the_providers_tools_pass_untouched(stack: Stack) -> None:
    stack.script.then(Reply(content="searched"))
    tools = [{"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
             {"type": "bash_20250124", "name": "bash"}, {**GET_WEATHER, "cache_control": {"type": "ephemeral"}}]
    await ask(stack, False, tools=tools, tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    assert sent(stack)["tools"][:3] == tools
    assert sent(stack)["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}


async def test_a_forced_gateway_tool_is_not_forced_again(stack: Stack) -> None:
    stack.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 2})]), Reply(content="3"))
    answer = await ask(stack, False, tool_choice={"type": "tool", "name": "add", "disable_parallel_tool_use": True})
    assert answer.text == "3"
    assert sent(stack, 0)["tool_choice"] == {"type": "tool", "name": "add", "disable_parallel_tool_use": True}
    assert sent(stack, 1)["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}


async def test_the_round_limit_asks_for_no_tools_in_anthropics_words(make_stack: StackFactory) -> None:
    stack = await make_stack(max_rounds=1)
    stack.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 2})]), Reply(tool_calls=[("add", {"a": 3, "b": 4})]))
    answer = await ask(stack, False)
    assert sent(stack, 1)["tool_choice"] == {"type": "none"}
    assert answer.calls == []
    assert answer.message["stop_reason"] == "end_turn"


@STREAM
async def test_a_provider_failure_after_tools_is_final_in_anthropics_shape(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 2})]),
                      *[Reply(status=500, error="the model fell over")] * 3)
    with pytest.raises(anthropic.APIStatusError) as failed:
        await ask(stack, stream)
    if stream:  # the stream had begun: the failure is its last event
        assert failed.value.body["type"] == "error"  # type: ignore[index]
        return
    assert failed.value.status_code == 502  # the provider's 5xx, as the gateway's
    assert failed.value.response.headers["x-should-retry"] == "false"  # Anthropic's client reads it too
    error = failed.value.body["error"]  # type: ignore[index]
    assert error["type"] == "api_error"
    assert "already run its tools for this request (add)" in error["message"]


async def test_keys_are_read_from_x_api_key_and_refused_in_anthropics_shape(make_stack: StackFactory) -> None:
    stack = await make_stack(keys={"alice": GatewayKey(key=SecretStr("sk-alice"))})
    stack.script.then(Reply(content="hi alice"))
    answer = await ask(stack, False, client=stack.anthropic(api_key="sk-alice"))
    assert answer.text == "hi alice"
    headers = {k.lower() for k in stack.model.request_headers[-1]}
    assert "x-api-key" not in headers
    assert "authorization" not in headers
    with pytest.raises(anthropic.AuthenticationError) as refused:
        await ask(stack, False, client=stack.anthropic(api_key="sk-mallory"))
    assert refused.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


async def test_the_operators_anthropic_key_goes_as_x_api_key(make_stack: StackFactory) -> None:
    stack = await make_stack(upstream_kind="anthropic", upstream_api_key=SecretStr("sk-ant-operator"))
    stack.script.then(Reply(content="ok"))
    response = await stack.http.post("/v1/messages", json={"model": "m", "max_tokens": 5, "messages": USER},
                                     headers={"x-api-key": "sk-callers-own"})
    assert response.status == 200
    headers = {k.lower(): v for k, v in stack.model.request_headers[-1].items()}
    assert headers["x-api-key"] == "sk-ant-operator"
    assert "authorization" not in headers
    assert headers["anthropic-version"] == "2023-06-01"  # the caller named none: the gateway's default


async def test_count_tokens_and_models_pass_through(stack: Stack) -> None:
    async with stack.anthropic() as client:
        counted = await client.messages.count_tokens(model="claude-test", messages=USER)  # type: ignore[arg-type]
        models = await client.models.list()
    assert counted.input_tokens > 0  # the provider's count
    assert [m.id for m in models.data] == ["toolspan-scripted"]


async def test_a_pass_through_error_is_in_anthropics_shape_for_its_client(stack: Stack) -> None:
    async with stack.anthropic() as client:
        with pytest.raises(anthropic.NotFoundError) as missing:
            await client.get("/v1/nothing-here", cast_to=object)
    assert missing.value.body["type"] == "error"  # type: ignore[index]


@STREAM
async def test_the_clients_calls_are_checked_and_their_results_observed(stack: Stack, stream: bool) -> None:
    stack.script.then(Reply(tool_calls=[("get_weather", {"town": "Paris"})]), Reply(content="Rainy."))
    first = await ask(stack, stream, tools=[GET_WEATHER])
    [check] = tool_call_spans(stack, first.headers["x-trace-id"], side=names.SIDE_CLIENT)
    attributes = check.attributes or {}
    assert attributes[names.ATTR_OUTCOME] == "rejected"
    assert attributes[names.ATTR_ARGS_MISSING] == ("city",)
    [call] = first.calls
    assert call["input"] == {"town": "Paris"}  # the client gets the call as the model made it
    messages = [*USER, {"role": "assistant", "content": first.message["content"]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "is_error": True,
                                              "content": "no such argument: town"}]}]
    second = await ask(stack, stream, tools=[GET_WEATHER], messages=messages)
    [step] = [s for s in stack.spans(second.headers["x-trace-id"]) if s.name == names.SPAN_TOOL_EXECUTE]
    assert (step.attributes or {})[names.ATTR_OUTCOME] == "error"  # the result's is_error, read as such
    assert stack.metric("toolspan_client_tool_roundtrip_seconds_count", tool="get_weather", outcome="error") == 1


async def test_a_streamed_answer_is_assembled_from_anthropics_events_by_the_client(stack: Stack) -> None:
    stack.script.then(Reply(content="Read it.", tool_calls=[("read_file", {"path": "a.txt"}),
                                                            ("get_weather", {"city": "Rome"})]))
    answer = await ask(stack, True, tools=[GET_WEATHER])
    types = [(e["type"], e.get("index")) for e in answer.events]
    assert types[0] == ("message_start", None)
    assert ("content_block_start", 1) in types  # the client's call, whole, after the text
    [call] = answer.calls
    assert call["input"] == {"city": "Rome"}
    delta = [e for e in answer.events if e["type"] == "message_delta"][-1]
    assert delta["delta"]["stop_reason"] == "tool_use"
    assert answer.text == "Read it."


async def test_an_anthropic_upstream_is_named_so_on_a_chat_span_per_round(aiohttp_server: Any) -> None:
    """`toolspan serve --upstream https://api.anthropic.com/v1` (kind anthropic): its spans say so."""
    upstream = await aiohttp_server(ScriptedModel(Script().then(Reply(tool_calls=[("add", {"a": 1, "b": 2})]),
                                                                Reply(content="3"))).app())
    exporter = InMemorySpanExporter()
    settings = Settings(port=0, upstream=str(upstream.make_url("/v1")), upstream_kind="anthropic",
                        trajectory_store=False)
    async with gateway(settings, processors=[SimpleSpanProcessor(exporter)]) as (url, _, _model), \
            anthropic.AsyncAnthropic(base_url=url, api_key="unused", max_retries=0) as client:
        await client.messages.create(model="claude-test", max_tokens=64, messages=USER)  # type: ignore[arg-type]
    chats = [s.attributes or {} for s in exporter.get_finished_spans()
             if s.name == f"{names.SPAN_CHAT_PREFIX} claude-test"]
    assert [(a[names.ATTR_PROVIDER_NAME], a[names.ATTR_FINISH_REASONS]) for a in chats] == [
        ("anthropic", ("tool_calls",)), ("anthropic", ("stop",))]
    assert [a[names.ATTR_INPUT_TOKENS] for a in chats] == [10, 10]


@STREAM
async def test_a_stream_the_provider_ends_with_an_error_event_ends_so_for_the_client(stack: Stack,
                                                                                     stream: bool) -> None:
    failing = (b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","type":"message",'
               b'"role":"assistant","model":"m","content":[],"stop_reason":null,"usage":{"input_tokens":3,'
               b'"output_tokens":1}}}\n\nevent: error\ndata: {"type":"error","error":{"type":"overloaded_error",'
               b'"message":"Overloaded"}}\n\n')
    stack.script.then(Reply(raw_stream=failing) if stream else Reply(status=529, raw=(
        b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}')))
    with pytest.raises(anthropic.APIStatusError) as failed:
        await ask(stack, stream)
    # Anthropic's overloaded error, as it said it: a 529 (which its client retries), or the stream's
    # last event, of the same type either way.
    assert failed.value.body["type"] == "error"  # type: ignore[index]
    assert failed.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    if not stream:
        assert isinstance(failed.value, anthropic.OverloadedError)
        assert "the provider answered 529: Overloaded" in failed.value.body["error"]["message"]  # type: ignore[index]
    else:  # the stream had begun: an error event, in Anthropic's shape
        assert "Overloaded" in failed.value.body["error"]["message"]  # type: ignore[index]


async def test_a_stream_is_kept_open_with_pings_while_the_gateways_tools_run(make_stack: StackFactory) -> None:
    stack = await make_stack(registry=ToolRegistry([Tool(name="slow_sum", function=slow_sum,
                                                         parameters=[Param("a", "number", required=True)])]),
                             keepalive_seconds=0.05)
    stack.script.then(Reply(content="Summing.", tool_calls=[("slow_sum", {"a": 1})]), Reply(content="Done."))
    async with stack.http.post("/v1/messages", json={"model": "m", "max_tokens": 64, "messages": USER,
                                                     "stream": True}, headers=AUTH) as response:
        text = (await response.read()).decode()
    kinds = [line.removeprefix("event: ") for line in text.splitlines() if line.startswith("event: ")]
    assert kinds.count("message_start") == 1
    assert kinds[-2:] == ["message_delta", "message_stop"]
    between = kinds[kinds.index("content_block_stop"):kinds.index("message_delta")]
    assert between.count("ping") >= 2  # Anthropic's own keep-alive, while the tool ran


async def slow_sum(args: dict[str, Any]) -> str:
    await asyncio.sleep(0.3)  # long enough for several keep-alives at 0.05 s
    return str(args["a"])


def _sse(*events: dict[str, Any]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


async def test_a_streams_citations_and_container_reach_the_client(stack: Stack) -> None:
    """A text block started with `"citations": null` gains its citations from citations_delta events,
    and the container a code execution ran in (said only in message_delta) reaches the client."""
    citation = {"type": "char_location", "cited_text": "Paris", "document_index": 0, "document_title": "atlas",
                "start_char_index": 0, "end_char_index": 5}
    container = {"id": "container_011CRZ", "expires_at": "2026-12-04T20:00:00Z"}
    stack.script.then(Reply(raw_stream=_sse(
        {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                                              "content": [], "stop_reason": None, "stop_sequence": None,
                                              "usage": {"input_tokens": 3, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": "", "citations": None}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "citations_delta", "citation": citation}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Paris."}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None, "container": container},
         "usage": {"output_tokens": 4}},
        {"type": "message_stop"})))
    answer = await ask(stack, True)
    assert answer.text == "Paris."
    assert answer.message["content"][0]["citations"] == [citation]
    assert answer.message["container"]["id"] == "container_011CRZ"
    [delta] = [e for e in answer.events if e["type"] == "message_delta"]
    assert delta["delta"]["container"]["id"] == "container_011CRZ"


# --- Anthropic's overloaded error (529, or an overloaded_error event) -----------------------------

OVERLOADED = Reply(status=529, error="Overloaded")


def overloaded_after(events: int) -> Reply:
    """A streamed answer that breaks off after its first `events` events (message_start, ping, then
    a text block's) with Anthropic's overloaded_error event."""
    opened = message_events(build_message({"model": "m"}, Reply(content="Partly said"), 90, "m"))[:events]
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    return Reply(raw_stream=b"".join(opened) + f"event: error\ndata: {json.dumps(error)}\n\n".encode())


async def quick_retries(make_stack: StackFactory) -> Stack:
    """A stack whose own retries after a tool round wait a moment, not the default half second."""
    return await make_stack(upstream_kind="anthropic", upstream_retry_backoff_seconds=0.01)


@pytest.mark.parametrize(("stream", "failure"), [(False, "529"), (True, "529"), (True, "event")])
async def test_an_overloaded_provider_after_a_tool_round_is_retried_by_the_gateway(
        make_stack: StackFactory, stream: bool, failure: str) -> None:
    """As a 503 is: the tool ran once, the client (no retries of its own) gets the answer."""
    stack = await quick_retries(make_stack)
    stack.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 2})]),
                      OVERLOADED if failure == "529" else overloaded_after(2), Reply(content="3"))
    answer = await ask(stack, stream)
    assert answer.text == "3"
    assert len(stack.upstream_requests) == 3  # the tool's round, the overloaded one, its retry
    assert [o for _, o in tool_outcomes(stack, answer.headers["x-trace-id"])] == ["ok"]
    assert stack.metric(names.METRIC_UPSTREAM_RETRIES, **{names.LABEL_MODEL: "claude-test"}) == 1


async def test_an_overloaded_provider_reaches_a_messages_client_as_the_529_its_sdk_retries(
        make_stack: StackFactory) -> None:
    stack = await make_stack(upstream_kind="anthropic")
    stack.script.then(Reply(status=529, error="Overloaded", headers={"retry-after": "0"}))
    with pytest.raises(anthropic.OverloadedError) as failed:
        await ask(stack, False)
    assert failed.value.body == {"type": "error", "error": {  # type: ignore[comparison-overlap]
        "type": "overloaded_error", "message": "the provider answered 529: Overloaded"}}
    assert failed.value.response.headers["retry-after"] == "0"
    # With its default retries, Anthropic's client sends it again, and gets the answer.
    stack.script.then(Reply(status=529, error="Overloaded", headers={"retry-after": "0"}), Reply(content="hi"))
    async with anthropic.AsyncAnthropic(base_url=stack.url, api_key="sk-test", timeout=20) as retrying:
        assert retrying.max_retries == 2
        assert (await ask(stack, False, client=retrying)).text == "hi"
    assert len(stack.upstream_requests) == 3


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_an_overloaded_provider_reaches_an_openai_client_as_a_503(stack: Stack, api: str) -> None:
    """Anthropic's 529 is no status OpenAI's clients know by name: they get a 503, which they retry
    as any 5xx (openai-python retries 408, 409, 429 and 5xx)."""
    stack.script.then(Reply(status=529, error="Overloaded"))
    asking = (stack.client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
              if api == "chat" else stack.client.responses.create(model="m", input="hi"))
    with pytest.raises(openai.InternalServerError) as failed:
        await asking
    assert failed.value.status_code == 503
    assert failed.value.body["code"] == "upstream_529"  # type: ignore[index]
    assert "the provider answered 529: Overloaded" in failed.value.body["message"]  # type: ignore[index]


@STREAM
async def test_an_overload_that_outlasts_the_retries_is_final_and_keeps_its_type(
        make_stack: StackFactory, stream: bool) -> None:
    stack = await quick_retries(make_stack)
    stack.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 2})]), *[OVERLOADED] * 3)
    async with anthropic.AsyncAnthropic(base_url=stack.url, api_key="sk-test", timeout=20) as retrying:
        with pytest.raises(anthropic.APIStatusError) as failed:
            await ask(stack, stream, client=retrying)
    error = failed.value.body["error"]  # type: ignore[index]
    assert error["type"] == "overloaded_error"
    assert "already run its tools for this request (add)" in error["message"]
    if not stream:
        assert isinstance(failed.value, anthropic.OverloadedError)
        assert failed.value.response.headers["x-should-retry"] == "false"
    assert len(stack.upstream_requests) == 4  # the client did not send it again: the tool ran once


async def test_an_overloaded_error_event_after_text_ends_the_stream_with_its_type(stack: Stack) -> None:
    stack.script.then(overloaded_after(5))  # message_start, ping, a text block's start and two deltas
    with pytest.raises(anthropic.APIStatusError) as failed:
        await ask(stack, True)
    assert failed.value.body == {"type": "error", "error": {  # type: ignore[comparison-overlap]
        "type": "overloaded_error", "message": "the provider reported an error mid-stream: Overloaded"}}
