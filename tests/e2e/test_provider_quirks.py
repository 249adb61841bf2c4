"""Odd but real things providers and callers send, and what the gateway makes of them."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from pytest_aiohttp import AiohttpClient
from yarl import URL

from gateway.apis.chat.answer import ChatStreamReader
from gateway.demo.model import Reply
from tests.conftest import AUTH, USER, Stack, StackFactory, tool_messages


def completion(message: dict[str, Any], usage: dict[str, Any] | None = None) -> bytes:
    return json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                       "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                       "usage": usage or {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()


@pytest.mark.parametrize("raw", [
    json.dumps({"choices": [None]}).encode(),
    completion({"role": "assistant", "tool_calls": [{"id": "c", "function": "read_file"}]}),
    completion({"role": "assistant", "tool_calls": ["read_file"]}),
], ids=["null-choice", "function-as-string", "call-as-string"])
async def test_a_malformed_completion_is_a_502_not_a_gateway_bug(stack: Stack, raw: bytes) -> None:
    stack.script.then(Reply(raw=raw))
    with pytest.raises(openai.APIStatusError) as caught:
        await stack.ask(False, messages=USER)
    assert caught.value.status_code == 502
    assert "wrong shape" in caught.value.message


async def test_arguments_sent_as_an_object_are_read_as_json(stack: Stack) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
    stack.script.then(Reply(raw=completion({"role": "assistant", "content": None, "tool_calls": [call]})),
                      Reply(content="5"))
    answer = await stack.ask(False, messages=USER)
    assert answer.content == "5"
    assert [m["content"] for m in tool_messages(stack.upstream_requests[1])] == ["5"]


async def test_negative_usage_does_not_break_the_request(stack: Stack) -> None:
    stack.script.then(Reply(raw=completion({"role": "assistant", "content": "hi"},
                                           {"prompt_tokens": -1, "completion_tokens": 3, "total_tokens": 2})))
    answer = await stack.ask(False, messages=USER)
    assert answer.content == "hi"


async def test_a_huge_event_without_done_still_streams(stack: Stack) -> None:
    text = "x" * 1_000_000  # past aiohttp's own line limit, in one event
    event = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
             "choices": [{"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}
    stack.script.then(Reply(raw=json.dumps(event).encode()))  # one event, and no [DONE] after it
    answer = await stack.ask(True, messages=USER)
    assert answer.content == text
    assert answer.finish_reason == "stop"


async def test_a_failure_after_the_stream_began_is_an_error_event(stack: Stack,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    original = ChatStreamReader.absorb

    def absorb(self: ChatStreamReader, chunk: dict[str, Any]) -> dict[str, Any] | None:
        if "".join(self._texts.get("content", [])):  # the second content delta: something nobody planned for
            raise RuntimeError("a gateway bug")
        return original(self, chunk)

    monkeypatch.setattr(ChatStreamReader, "absorb", absorb)
    stack.script.then(Reply(content="a long enough answer"))
    async with stack.http.post("/v1/chat/completions", json={"model": "m", "messages": USER, "stream": True},
                               headers=AUTH) as response:
        assert response.status == 200
        body = (await response.read()).decode()  # a well-formed chunked body: no HTTP inside it
    events = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: {")]
    assert events[-1]["error"]["code"] == "internal_error"
    assert "Traceback" not in body
    assert "a gateway bug" not in body


@pytest.mark.parametrize("n", [{"a": 1}, "abc", [2], 0, "2", 2.0, True])
async def test_n_must_be_a_positive_integer(stack: Stack, n: Any) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await stack.client.chat.completions.create(model="m", messages=USER, n=n)  # type: ignore[arg-type]
    assert caught.value.body["param"] == "n"  # type: ignore[index]


async def test_stream_null_and_custom_tools_are_accepted(stack: Stack) -> None:
    stack.script.then(Reply(content="ok"))
    custom = {"type": "custom", "custom": {"name": "grammar"}}
    async with stack.http.post("/v1/chat/completions", headers=AUTH,
                               json={"model": "m", "messages": USER, "stream": None, "tools": [custom]}) as response:
        assert response.status == 200
    assert custom in stack.upstream_requests[0]["tools"]


@pytest.mark.parametrize("path", ["/v1/../secret", "/v1/%2e%2e/secret", "/v1/models/../../secret"])
async def test_the_pass_through_never_leaves_v1(make_stack: StackFactory, path: str) -> None:
    stack = await make_stack(upstream_api_key="sk-provider-key")
    # The test client's session with the whole URL: `stack.http.get(path)` would resolve the dot segments first.
    async with stack.http.session.get(URL(stack.url + path, encoded=True)) as response:
        assert response.status in (400, 404)
        body = await response.text()
    assert "sk-provider-key" not in body


def test_tool_call_fragments_without_an_index_continue_the_last_call() -> None:
    reader = ChatStreamReader()
    for part in ({"id": "c1", "function": {"name": "read_file", "arguments": ""}},
                 {"function": {"arguments": '{"path":'}}, {"function": {"arguments": ' "a"}'}},
                 {"id": "c2", "function": {"name": "add", "arguments": "{}"}}):
        reader.absorb({"choices": [{"delta": {"tool_calls": [part]}}]})
    reader.absorb({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]})
    assert [(c.id, c.name, c.arguments) for c in reader.turn().calls] == [
        ("c1", "read_file", '{"path": "a"}'), ("c2", "add", "{}")]


async def test_provider_account_headers_stay_behind(stack: Stack, aiohttp_client: AiohttpClient) -> None:
    assert stack.upstream_server is not None
    upstream = await aiohttp_client(stack.upstream_server)  # straight to the provider, past the gateway
    async with upstream.post("/v1/echo", data=b"x") as direct:
        assert direct.headers["openai-organization"] == "org-scripted"  # the provider does send it
    async with stack.http.post("/v1/echo", data=b"x", headers=AUTH) as response:
        assert response.status == 200
        assert "openai-organization" not in {k.lower() for k in response.headers}
