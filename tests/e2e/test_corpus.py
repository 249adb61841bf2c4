"""Recorded provider answers replayed through the gateway.

tests/corpus holds one provider answer per file, written from each provider's documentation:
`NAME.json` as the provider answers a plain request, `NAME.sse` the bytes of its stream. Each is
replayed as the only answer and after a round of the gateway's own tools, and the client must get
what the provider sent, field for field, except for the changes the gateway documents:

- Chat, plain, one round: the body exactly as sent.
- Chat, plain, after a gateway round: the message's text fields joined over the rounds, only the
  client's tool calls (under ids naming the held turn), usage summed over the rounds.
- Chat, streamed: the same assembled answer (see `assemble`), with usage only in one last chunk
  with `choices: []` (when the client asked for it), the client's calls whole at the end, every
  chunk under the first answer's id, created and model, and no chunk that carries nothing.
- Responses: the response as the client knows it (its id, previous_response_id, tools and
  tool_choice); streamed, the same events in order, numbered from 0, output indexes counted over
  the rounds.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gateway.demo.model import Reply
from gateway.state import RESPONSE_PREFIX, split_call_id
from tests.conftest import AUTH, USER, Stack, tool_messages

CORPUS = Path(__file__).parents[1] / "corpus"
CHAT = ["openai_logprobs", "openai_refusal", "azure_content_filter", "vllm_reasoning", "deepseek_reasoner",
        "vllm_continuous_usage", "llamacpp_object_arguments"]
RESPONSES = ["openai_responses_reasoning"]
MODEL = "corpus-model"
GET_WEATHER = {"type": "function", "function": {  # the client's own tool (llamacpp_object_arguments calls it)
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                   "required": ["city"]}}}
ROUND = pytest.mark.parametrize("gateway_round", [False, True], ids=["one-round", "after-a-gateway-round"])
USAGE = pytest.mark.parametrize("include_usage", [True, False], ids=["usage", "no-usage"])

# The first round, when there is one: the scripted model calls the gateway's `add` and reports this usage.
FIRST_ROUND = Reply(tool_calls=[("add", {"a": 1, "b": 2})])
FIRST_CHAT_USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
FIRST_RESPONSES_USAGE = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                         "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15}


def recording(name: str, stream: bool) -> bytes:
    return (CORPUS / f"{name}.{'sse' if stream else 'json'}").read_bytes()


def script(stack: Stack, name: str, stream: bool, gateway_round: bool) -> None:
    """The provider's answers: the gateway's round first (if any), then the recording."""
    if gateway_round:
        stack.script.then(FIRST_ROUND)
    raw = recording(name, stream)
    stack.script.then(Reply(raw_stream=raw) if stream else Reply(raw=raw))


def sse(data: bytes | str) -> list[tuple[str | None, dict[str, Any]]]:
    """(event name, payload) of each event of an SSE stream, without comments and `[DONE]`."""
    text = data.decode() if isinstance(data, bytes) else data
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        lines = block.split("\n")
        payload = "\n".join(line[5:].strip() for line in lines if line.startswith("data:"))
        if payload and payload != "[DONE]":
            name = next((line[6:].strip() for line in lines if line.startswith("event:")), None)
            events.append((name, json.loads(payload)))
    return events


def summed(*usages: dict[str, Any]) -> dict[str, Any]:
    """Usage added up, nested details too (a null count is no count)."""
    total: dict[str, Any] = {}
    for usage in usages:
        for key, value in usage.items():
            if isinstance(value, dict):
                total[key] = summed(total.get(key) or {}, value)
            elif isinstance(value, int | float) and not isinstance(value, bool):
                total[key] = total.get(key, 0) + value
    return total


def arguments(value: Any) -> Any:
    """A tool call's arguments as data, whether sent as JSON text or (some servers) as an object."""
    try:
        return json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return value


def handed_back(calls: list[dict[str, Any]], ids: list[str]) -> list[dict[str, Any]]:
    """The client's calls after a gateway round: the same, under ids naming the turn the gateway
    holds (`ids`, as the client got them), each of which must name the provider's own id."""
    originals = [parts[1] if (parts := split_call_id(i)) else None for i in ids]
    assert originals == [call["id"] for call in calls]
    return [{**call, "id": new} for call, new in zip(calls, ids, strict=True)]


# --- assembling a chat stream ---------------------------------------------------------------------

ENVELOPE = frozenset({"id", "created", "model", "object", "choices", "usage"})  # checked on their own
PER_CHUNK = frozenset({"index", "delta", "finish_reason", "logprobs"})  # a choice's fields assembled apart


@dataclass
class Assembled:
    """A streamed chat completion, put together from its chunks."""

    texts: dict[str, str] = field(default_factory=dict)  # each delta text field, concatenated
    top: dict[str, list[Any]] = field(default_factory=dict)  # each other top-level field: its values, in order
    choice: dict[str, list[Any]] = field(default_factory=dict)  # each other choice-level field: likewise
    logprobs: dict[str, list[Any]] = field(default_factory=dict)  # logprobs.content (.refusal), concatenated
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)  # tool calls by index, fragments joined
    finish_reason: str | None = None
    usage: list[dict[str, Any]] = field(default_factory=list)  # every usage a chunk carried


def _note(values: dict[str, list[Any]], key: str, value: Any) -> None:
    if value is not None and value not in values.setdefault(key, []):
        values[key].append(value)


def _absorb_call(calls: dict[int, dict[str, Any]], part: dict[str, Any]) -> None:
    call = calls.setdefault(part.get("index", len(calls)), {"id": None, "type": None, "name": "", "arguments": None})
    call["id"] = call["id"] or part.get("id")
    call["type"] = call["type"] or part.get("type")
    function = part.get("function") or {}
    call["name"] += function.get("name") or ""
    value = function.get("arguments")
    if isinstance(value, str):
        call["arguments"] = (call["arguments"] or "") + value
    elif value is not None:
        call["arguments"] = value


def assemble(chunks: list[dict[str, Any]]) -> Assembled:
    """Concatenate each delta text field, collect top-level and choice-level fields, concatenate
    the logprobs lists, join the tool-call fragments, keep the finish reason and every usage."""
    out = Assembled()
    for chunk in chunks:
        for key, value in chunk.items():
            if key not in ENVELOPE:
                _note(out.top, key, value)
        if chunk.get("usage") is not None:
            out.usage.append(chunk["usage"])
        for choice in chunk.get("choices") or []:
            for key, value in choice.items():
                if key not in PER_CHUNK:
                    _note(out.choice, key, value)
            for key, value in (choice.get("delta") or {}).items():
                if key == "tool_calls":
                    for part in value or []:
                        _absorb_call(out.calls, part)
                elif isinstance(value, str):
                    out.texts[key] = out.texts.get(key, "") + value
                else:
                    _note(out.choice, f"delta.{key}", value)
            for key, entries in (choice.get("logprobs") or {}).items():
                out.logprobs.setdefault(key, []).extend(entries or [])
            out.finish_reason = choice.get("finish_reason") or out.finish_reason
    out.texts = {key: text for key, text in out.texts.items() if text}  # "" and absent read alike
    out.logprobs = {key: entries for key, entries in out.logprobs.items() if entries}
    for call in out.calls.values():
        call["arguments"] = arguments(call["arguments"])
    return out


def identity(chunk: dict[str, Any]) -> tuple[Any, Any, Any]:
    return chunk.get("id"), chunk.get("created"), chunk.get("model")


# --- Chat Completions -----------------------------------------------------------------------------

def chat_request(stream: bool, include_usage: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": USER, "tools": [GET_WEATHER]}
    if stream:
        body["stream"] = True
        if include_usage:
            body["stream_options"] = {"include_usage": True}
    return body


def check_gateway_round(stack: Stack, gateway_round: bool) -> None:
    """The gateway ran `add` between the two provider calls (and made no other)."""
    assert len(stack.upstream_requests) == 1 + gateway_round
    if gateway_round:
        assert [m["content"] for m in tool_messages(stack.upstream_requests[1])] == ["3"]


def chat_after_round(sent: dict[str, Any], got: dict[str, Any]) -> dict[str, Any]:
    """The plain answer after a gateway round: the last answer, its message's texts joined with
    the first round's (which had none), only the client's calls, usage summed over both rounds."""
    want = copy.deepcopy(sent)
    message = want["choices"][0]["message"]
    for key in ("content", "refusal", "reasoning_content", "reasoning"):
        if key == "content" or isinstance(message.get(key), str):
            message[key] = message.get(key) or None  # joined over the rounds: nothing joined is null
    calls = message.pop("tool_calls", None) or []
    if calls:
        ids = [call["id"] for call in got["choices"][0]["message"].get("tool_calls") or []]
        message["tool_calls"] = handed_back(calls, ids)
    want["usage"] = summed(FIRST_CHAT_USAGE, sent["usage"])
    return want


@ROUND
@pytest.mark.parametrize("name", CHAT)
async def test_a_plain_chat_answer_reaches_the_client_as_sent(stack: Stack, name: str, gateway_round: bool) -> None:
    script(stack, name, False, gateway_round)
    async with stack.http.post("/v1/chat/completions", json=chat_request(False), headers=AUTH) as response:
        assert response.status == 200, await response.text()
        got = await response.json()
    sent = json.loads(recording(name, False))
    assert got == (chat_after_round(sent, got) if gateway_round else sent)
    check_gateway_round(stack, gateway_round)


@USAGE
@ROUND
@pytest.mark.parametrize("name", CHAT)
async def test_a_streamed_chat_answer_reaches_the_client_as_sent(stack: Stack, name: str, gateway_round: bool,
                                                                 include_usage: bool) -> None:
    script(stack, name, True, gateway_round)
    async with stack.http.post("/v1/chat/completions", json=chat_request(True, include_usage),
                               headers=AUTH) as response:
        assert response.status == 200, await response.text()
        chunks = [payload for _, payload in sse(await response.read())]
    check_gateway_round(stack, gateway_round)
    sent_chunks = [payload for _, payload in sse(recording(name, True))]
    got, sent = assemble(chunks), assemble(sent_chunks)

    assert got.texts == sent.texts
    assert got.logprobs == sent.logprobs
    assert got.top == sent.top
    assert got.choice == sent.choice
    assert got.finish_reason == sent.finish_reason
    calls = list(sent.calls.values())
    if gateway_round and calls:
        calls = handed_back(calls, [call["id"] for call in got.calls.values()])
    assert list(got.calls.values()) == calls

    # Every chunk goes by the first answer's id, created and model.
    first = identity(chunks[0]) if gateway_round else identity(next(c for c in sent_chunks if c.get("choices")))
    assert {identity(c) for c in chunks} == {first}
    if gateway_round:  # the scripted model's first answer
        assert first[0] == "chatcmpl-scripted-1"
        assert first[2] == MODEL
    assert {c.get("object") for c in chunks} == {"chat.completion.chunk"}

    # Usage: never on content chunks; summed over the rounds, once, last, when the client asked for it.
    content = [c for c in chunks if c["choices"]]
    assert [c for c in content if "usage" in c] == []
    with_usage = [c for c in chunks if "usage" in c]
    if include_usage:
        usage = summed(*([FIRST_CHAT_USAGE] if gateway_round else []), sent.usage[-1])
        assert with_usage == [chunks[-1]]
        assert chunks[-1]["choices"] == []
        assert chunks[-1]["usage"] == usage
    else:
        assert with_usage == []

    # No chunk that carries nothing (an annotation of the choice, such as a content filter's, is
    # something); the client's calls whole, after everything else the model said.
    for n, chunk in enumerate(content):
        choice = chunk["choices"][0]
        annotated = any(k not in ("index", "delta", "finish_reason", "logprobs") and v not in (None, {}, [])
                        for k, v in choice.items())
        assert choice["delta"] or choice["finish_reason"] or annotated, chunk
        assert n == 0 or annotated or choice["delta"] != {"content": ""}, chunk
    with_calls = [n for n, c in enumerate(content) if c["choices"][0]["delta"].get("tool_calls")]
    with_text = [n for n, c in enumerate(content) if set(c["choices"][0]["delta"]) - {"tool_calls", "role"}]
    assert len(with_calls) == len(calls)
    assert all(t < n for t in with_text for n in with_calls)

    # And the openai client reads every chunk.
    script(stack, name, True, gateway_round)
    request = chat_request(True, include_usage)
    stream = await stack.client.chat.completions.create(**request)
    parsed = [chunk.to_dict() async for chunk in stream]
    assert len(parsed) == len(chunks)
    if not gateway_round:
        assert parsed == chunks


# --- Responses ------------------------------------------------------------------------------------

RESPONSES_REQUEST = {"model": MODEL, "input": "Which is larger, 9.11 or 9.8?"}


def response_as_client_knows(sent: dict[str, Any], answer_id: str, gateway_round: bool) -> dict[str, Any]:
    """The provider's response under the answer's id, without the gateway's tools (the provider
    echoed them; the client sent none), its usage summed over the rounds."""
    want = {**sent, "id": answer_id, "tools": []}
    if gateway_round:
        want["usage"] = summed(FIRST_RESPONSES_USAGE, sent["usage"])
    return want


def check_answer_id(answer_id: str, sent: dict[str, Any], gateway_round: bool) -> None:
    """One round: the provider's id; after a gateway round, an id of the gateway's own."""
    if gateway_round:
        assert answer_id.startswith(RESPONSE_PREFIX)
        assert answer_id != sent["id"]
    else:
        assert answer_id == sent["id"]


def check_responses_round(stack: Stack, gateway_round: bool) -> None:
    assert len(stack.upstream_requests) == 1 + gateway_round
    if gateway_round:
        outputs = [i for i in stack.upstream_requests[1]["input"] if i.get("type") == "function_call_output"]
        assert [o["output"] for o in outputs] == ["3"]


@ROUND
@pytest.mark.parametrize("name", RESPONSES)
async def test_a_plain_response_reaches_the_client_as_sent(stack: Stack, name: str, gateway_round: bool) -> None:
    script(stack, name, False, gateway_round)
    async with stack.http.post("/v1/responses", json=RESPONSES_REQUEST, headers=AUTH) as response:
        assert response.status == 200, await response.text()
        got = await response.json()
    check_responses_round(stack, gateway_round)
    sent = json.loads(recording(name, False))
    check_answer_id(got["id"], sent, gateway_round)
    assert got == response_as_client_knows(sent, got["id"], gateway_round)


@ROUND
@pytest.mark.parametrize("name", RESPONSES)
async def test_a_streamed_response_reaches_the_client_as_sent(stack: Stack, name: str, gateway_round: bool) -> None:
    script(stack, name, True, gateway_round)
    async with stack.http.post("/v1/responses", json={**RESPONSES_REQUEST, "stream": True},
                               headers=AUTH) as response:
        assert response.status == 200, await response.text()
        events = sse(await response.read())
    check_responses_round(stack, gateway_round)
    got = [payload for _, payload in events]
    sent = [payload for _, payload in sse(recording(name, True))]

    assert [event for event, _ in events] == [p["type"] for p in got]
    assert [p["type"] for p in got] == [p["type"] for p in sent]
    assert [p["sequence_number"] for p in got] == list(range(len(got)))
    final = got[-1]["response"]
    check_answer_id(final["id"], sent[-1]["response"], gateway_round)
    for shown, recorded in zip(got, sent, strict=True):
        number = {"sequence_number": shown["sequence_number"]}
        if "response" not in recorded:  # the first round showed no items: output indexes as recorded
            assert shown == {**recorded, **number}
        elif recorded["type"] == "response.completed" or not gateway_round:
            want = response_as_client_knows(recorded["response"], final["id"], gateway_round)
            assert shown == {**recorded, **number, "response": want}
        else:  # opened by the first round's response, under the answer's id
            assert shown["response"]["id"] == final["id"]

    # And the openai client reads every event.
    script(stack, name, True, gateway_round)
    answer = await stack.respond(True, **RESPONSES_REQUEST)
    assert len(answer.events) == len(got)


# --- Messages -------------------------------------------------------------------------------------

MESSAGES = ["anthropic_text", "anthropic_tool_use", "anthropic_thinking", "anthropic_redacted_thinking"]
GET_WEATHER_MESSAGES = {"name": "get_weather", "description": "Current weather in a location", "input_schema": {
    "type": "object", "properties": {"location": {"type": "string"}, "unit": {"type": "string"}},
    "required": ["location"]}}  # the client's own tool: anthropic_tool_use and anthropic_thinking call it
MESSAGES_REQUEST = {"model": MODEL, "max_tokens": 2048, "tools": [GET_WEATHER_MESSAGES],
                    "messages": [{"role": "user", "content": "What's the weather like in Paris?"}]}
# The scripted model's first round (the gateway's `add`) names the message and reports this usage.
FIRST_MESSAGES_USAGE = {"input_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                        "output_tokens": 5}


def message_as_client_gets(sent: dict[str, Any], gateway_round: bool, ids: list[str]) -> dict[str, Any]:
    """One round: the provider's message as it came. After a gateway round: the same, named as the
    first round (which showed nothing: its only block was the gateway's call), the client's calls
    under ids naming the turn the gateway holds (`ids`, as the client got them), its token counts
    summed over the rounds and its other usage fields (service tier ...) the last round's."""
    if not gateway_round:
        return sent
    renamed = iter(handed_back([b for b in sent["content"] if b["type"] == "tool_use"], ids))
    content = [next(renamed) if block["type"] == "tool_use" else block for block in sent["content"]]
    return {**sent, "id": "msg_scripted_1", "model": MODEL, "content": content,
            "usage": {**sent["usage"], **summed(FIRST_MESSAGES_USAGE, sent["usage"])}}


def call_ids(message: dict[str, Any]) -> list[str]:
    return [block["id"] for block in message["content"] if block["type"] == "tool_use"]


def check_messages_round(stack: Stack, gateway_round: bool) -> None:
    assert len(stack.upstream_requests) == 1 + gateway_round
    if gateway_round:
        [result] = stack.upstream_requests[1]["messages"][-1]["content"]
        assert (result["type"], result["content"]) == ("tool_result", "3")


@ROUND
@pytest.mark.parametrize("name", MESSAGES)
async def test_a_plain_message_reaches_the_client_as_sent(stack: Stack, name: str, gateway_round: bool) -> None:
    script(stack, name, False, gateway_round)
    async with stack.http.post("/v1/messages", json=MESSAGES_REQUEST, headers=AUTH) as response:
        assert response.status == 200, await response.text()
        got = await response.json()
    check_messages_round(stack, gateway_round)
    assert got == message_as_client_gets(json.loads(recording(name, False)), gateway_round, call_ids(got))


@ROUND
@pytest.mark.parametrize("name", MESSAGES)
async def test_a_streamed_message_reaches_the_client_as_sent(stack: Stack, name: str, gateway_round: bool) -> None:
    """Every event as the provider sent it, in order (pings too), but the client's calls (whole, at
    the end) and the end of the message (written anew, with the usage of every round); Anthropic's
    client assembles from them the same message as from the plain answer."""
    script(stack, name, True, gateway_round)
    async with stack.http.post("/v1/messages", json={**MESSAGES_REQUEST, "stream": True},
                               headers=AUTH) as response:
        assert response.status == 200, await response.text()
        events = sse(await response.read())
    check_messages_round(stack, gateway_round)
    got = [payload for _, payload in events]
    assert [event for event, _ in events] == [p["type"] for p in got]
    recorded = [p for _, p in sse(recording(name, True))]
    calls = {p["index"] for p in recorded if p["type"] == "content_block_start"
             and p["content_block"]["type"] == "tool_use"}
    ending = ("message_delta", "message_stop")
    passed = [p for p in recorded if p.get("index") not in calls and p["type"] not in ending]
    shown = [p for p in got if p.get("index") not in calls and p["type"] not in ending]
    if gateway_round:  # the first round opened the message (its call was the gateway's: not shown)
        assert [p["type"] for p in shown[:2]] == ["message_start", "ping"]
        assert shown[0]["message"]["id"] == "msg_scripted_1"
        shown, passed = shown[2:], passed[1:]
    assert shown == passed
    sent = json.loads(recording(name, False))
    [delta] = [p for p in got if p["type"] == "message_delta"]
    assert delta["delta"]["stop_reason"] == sent["stop_reason"]
    handed = [p["content_block"]["id"] for p in got if p["type"] == "content_block_start"
              and p["content_block"]["type"] == "tool_use"]
    want = message_as_client_gets(sent, gateway_round, handed)
    assert delta["usage"] == want["usage"]
    assert got[-1] == {"type": "message_stop"}

    script(stack, name, True, gateway_round)  # and Anthropic's client assembles the same message
    async with stack.anthropic() as client, client.messages.stream(**MESSAGES_REQUEST) as streamed:  # type: ignore[arg-type]
        message = (await streamed.get_final_message()).to_dict()
    want = message_as_client_gets(sent, gateway_round, call_ids(message))
    fields = ("type", "text", "thinking", "signature", "data", "id", "name", "input")
    assert [{k: b[k] for k in fields if k in b} for b in message["content"]] == [
        {k: b[k] for k in fields if k in b} for b in want["content"]]
    assert {k: message["usage"][k] for k in FIRST_MESSAGES_USAGE} == {k: want["usage"][k] for k in FIRST_MESSAGES_USAGE}
    assert (message["stop_reason"], message["model"]) == (want["stop_reason"], want["model"])
