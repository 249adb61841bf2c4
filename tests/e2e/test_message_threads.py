"""Anthropic's message threads (the beta `thread` field) through the gateway, with Anthropic's own
client: its tool runner (which threads by default) through a turn that calls both the gateway's
and the client's tools, and after a gateway round; `client.beta.messages.thread()` going on after an
answer the gateway's tools made; a thread the gateway does not hold (too large, Redis down, another
key's) sent whole again by the SDK; and the refusals. The scripted provider holds threads as
Anthropic's API does, so a `thread` passed on would end in the gateway's own calls there."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx2
import pytest
from anthropic import beta_async_tool
from pydantic import SecretStr

from gateway.demo.model import Reply
from gateway.settings.parts import GatewayKey
from tests.conftest import STREAM, Stack, StackFactory
from tests.e2e.redis_server import RedisServer
from tests.e2e.test_messages import GET_WEATHER, USER


@beta_async_tool
async def get_weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: The city.
    """
    return f"sunny in {city}"


class Sent:
    """The request bodies Anthropic's client sent to the gateway, as it sent them."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def __call__(self, request: httpx2.Request) -> None:
        self.bodies.append(json.loads(await request.aread()))

    def client(self, stack: Stack) -> anthropic.AsyncAnthropic:
        """Anthropic's client, its requests recorded here."""
        http = anthropic.DefaultAsyncHttpxClient(event_hooks={"request": [self]})
        return anthropic.AsyncAnthropic(base_url=stack.url, api_key="sk-test", max_retries=0, timeout=20,
                                        http_client=http)


async def run_tools(client: anthropic.AsyncAnthropic, stream: bool, content: str) -> str:
    """Anthropic's SDK tool runner (it keeps its conversation in a thread unless told not to) over
    `get_weather`, to its final message: that message's text."""
    runner = client.beta.messages.tool_runner(model="claude-test", max_tokens=512, tools=[get_weather],
                                              messages=[{"role": "user", "content": content}], stream=stream)
    if stream:
        async for streamed in runner:
            async for _ in streamed:
                pass
    else:
        async for _ in runner:
            pass
    final = await runner.until_done()
    return "".join(block.text for block in final.content if block.type == "text")


@STREAM
async def test_the_sdks_tool_runner_threads_through_a_turn_calling_both_sides(
        make_stack: StackFactory, state: dict[str, Any], stream: bool) -> None:
    """The model calls the gateway's read_file and the client's get_weather at once: the runner gets
    its call, runs it and continues the thread with only its result. The gateway holds the thread
    (in memory, or in Redis); the provider never sees `thread`: it gets the whole conversation, the
    gateway's result beside the client's."""
    stack = await make_stack(upstream_kind="anthropic", **state)
    stack.script.then(Reply(content="Both.", tool_calls=[("read_file", {"path": "a.txt"}),
                                                         ("get_weather", {"city": "Paris"})]),
                      Reply(content="a.txt holds contents of a.txt; Paris is sunny."))
    sent = Sent()
    async with sent.client(stack) as client:
        text = await run_tools(client, stream, "What is in a.txt, and the weather in Paris?")
    assert text == "a.txt holds contents of a.txt; Paris is sunny."
    create, follow = sent.bodies
    assert create["thread"] == {"type": "create"}
    assert follow["thread"]["type"] == "continue"
    assert [m["role"] for m in follow["messages"]] == ["user"]  # only the runner's result
    assert "tools" not in follow  # a thread keeps its tools
    assert all("thread" not in body for body in stack.upstream_requests)
    last = stack.upstream_requests[-1]
    assert [t["name"] for t in last["tools"]] == ["get_weather", "read_file", "add"]
    assert [m["role"] for m in last["messages"]] == ["user", "assistant", "user"]
    assert [(b["tool_use_id"], b["content"]) for b in last["messages"][2]["content"]] == [
        ("toolu_scripted_1_0", "contents of a.txt"), ("toolu_scripted_1_1", "sunny in Paris")]


@STREAM
async def test_a_thread_continued_after_a_gateway_round_goes_on_from_its_answer(
        make_stack: StackFactory, stream: bool) -> None:
    """The gateway's read_file ran in the answer's first round; the runner's thread then goes on
    with the client's own tool, from that answer (named by its first round): the provider gets the
    whole conversation, the gateway's round answered in it, not one that ends in the gateway's call."""
    stack = await make_stack(upstream_kind="anthropic")
    stack.script.then(Reply(tool_calls=[("read_file", {"path": "a.txt"})]),
                      Reply(content="It holds contents of a.txt.", tool_calls=[("get_weather", {"city": "Paris"})]),
                      Reply(content="And Paris is sunny."))
    sent = Sent()
    async with sent.client(stack) as client:
        text = await run_tools(client, stream, "What is in a.txt? Then the weather in Paris.")
    assert text == "And Paris is sunny."
    assert [body["thread"]["type"] for body in sent.bodies] == ["create", "continue"]
    assert all("thread" not in body for body in stack.upstream_requests)
    last = stack.upstream_requests[-1]
    assert [m["role"] for m in last["messages"]] == ["user", "assistant", "user", "assistant", "user"]
    assert last["messages"][1:3] == [
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_scripted_1_0", "name": "read_file", "input": {"path": "a.txt"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_scripted_1_0", "content": "contents of a.txt"}]}]
    assert last["messages"][3]["content"] == [
        {"type": "text", "text": "It holds contents of a.txt."},
        {"type": "tool_use", "id": "toolu_scripted_2_0", "name": "get_weather", "input": {"city": "Paris"}}]
    assert last["messages"][4]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_scripted_2_0", "content": "sunny in Paris"}]


async def send(thread: Any, stream: bool, text: str) -> str:
    """One turn of a thread of Anthropic's SDK (`client.beta.messages.thread`): the answer's text."""
    said = {"role": "user", "content": text}
    if stream:
        async with thread.stream(said) as streamed:
            answer = await streamed.get_final_message()
    else:
        answer = await thread.send(said)
    return "".join(block.text for block in answer.content if block.type == "text")


@STREAM
async def test_a_thread_goes_on_after_an_answer_the_gateways_tools_made(make_stack: StackFactory,
                                                                        stream: bool) -> None:
    """The first turn's answer took a round of the gateway's read_file; the next turn continues the
    thread from it with a new question: the provider gets the conversation as the client saw it
    (the question, the answer, the new question), with the system prompt the thread keeps."""
    stack = await make_stack(upstream_kind="anthropic")
    stack.script.then(Reply(tool_calls=[("read_file", {"path": "a.txt"})]),
                      Reply(content="It holds contents of a.txt."), Reply(content="You are welcome."))
    sent = Sent()
    async with sent.client(stack) as client:
        thread = client.beta.messages.thread(model="claude-test", max_tokens=512, system="Be brief.")
        assert await send(thread, stream, "What is in a.txt?") == "It holds contents of a.txt."
        assert await send(thread, stream, "Thanks.") == "You are welcome."
    create, follow = sent.bodies
    assert (create["thread"], create["system"]) == ({"type": "create"}, "Be brief.")
    assert follow["thread"]["type"] == "continue"
    assert "system" not in follow
    assert follow["messages"] == [{"role": "user", "content": "Thanks."}]
    assert all("thread" not in body for body in stack.upstream_requests)
    last = stack.upstream_requests[-1]
    assert last["system"] == "Be brief."
    assert last["messages"] == [{"role": "user", "content": "What is in a.txt?"},
                                {"role": "assistant", "content": [
                                    {"type": "text", "text": "It holds contents of a.txt."}]},
                                {"role": "user", "content": "Thanks."}]


async def test_a_thread_the_gateway_does_not_hold_is_sent_whole_again_by_the_sdk(make_stack: StackFactory) -> None:
    """Too large to keep (answer_record_max_bytes), the thread is not held: its continuation is a
    404 `thread_not_found`, on which Anthropic's SDK sends the whole conversation under a new thread."""
    stack = await make_stack(upstream_kind="anthropic", answer_record_max_bytes=64)
    stack.script.then(Reply(content="Hello."), Reply(content="Fine, thanks."))
    sent = Sent()
    async with sent.client(stack) as client:
        thread = client.beta.messages.thread(model="claude-test", max_tokens=512)
        assert await send(thread, False, "Hi.") == "Hello."
        assert await send(thread, False, "How are you?") == "Fine, thanks."
    assert [body["thread"]["type"] for body in sent.bodies] == ["create", "continue", "create"]
    assert [m["content"] for m in sent.bodies[2]["messages"]][::2] == ["Hi.", "How are you?"]
    assert len(stack.upstream_requests) == 2  # the continuation went no further than the gateway


async def test_a_thread_belongs_to_the_key_that_made_it(make_stack: StackFactory) -> None:
    """Another key continuing alice's thread hears what it hears of a thread that does not exist."""
    stack = await make_stack(upstream_kind="anthropic", keys={"alice": GatewayKey(key=SecretStr("sk-alice")),
                                                              "bob": GatewayKey(key=SecretStr("sk-bob-01"))})
    stack.script.then(Reply(content="Hello, alice."), Reply(content="Still you, alice."))

    async def post(key: str, thread: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        response = await stack.http.post("/v1/messages", headers={"x-api-key": key}, json={
            "model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], "thread": thread})
        return response.status, await response.json()

    status, created = await post("sk-alice", {"type": "create"})
    assert status == 200
    continued = {"type": "continue", "previous_message_id": created["id"]}
    foreign = await post("sk-bob-01", continued)
    unknown = await post("sk-bob-01", {"type": "continue", "previous_message_id": "msg_nobody_made"})
    assert foreign == (404, {"type": "error", "error": {
        "type": "not_found_error", "message": f"thread: no thread continues from message '{created['id']}'",
        "details": {"error_code": "thread_not_found"}}})
    assert unknown[0] == 404
    assert unknown[1]["error"]["details"] == {"error_code": "thread_not_found"}
    status, again = await post("sk-alice", continued)
    assert (status, again["content"][0]["text"]) == (200, "Still you, alice.")
    assert len(stack.upstream_requests) == 2


@pytest.mark.parametrize("thread", [
    "create", ["create"], {"type": "resume"}, {"type": "continue"}, {"type": "continue", "previous_message_id": 7},
    {"type": "continue", "previous_message_id": ""}, {"type": "continue", "previous_message_id": "m" * 257}])
async def test_a_thread_of_another_shape_is_a_400(stack: Stack, thread: Any) -> None:
    response = await stack.http.post("/v1/messages", json={"model": "m", "max_tokens": 5, "messages": USER,
                                                           "thread": thread})
    assert response.status == 400
    body = await response.json()
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("thread must be")
    assert stack.upstream_requests == []


async def test_a_continued_thread_may_not_send_its_system_or_tools_again(stack: Stack) -> None:
    stack.script.then(Reply(content="Hello."))
    first = await stack.http.post("/v1/messages", json={"model": "m", "max_tokens": 5, "messages": USER,
                                                        "system": "Be brief.", "thread": {"type": "create"}})
    continued = {"type": "continue", "previous_message_id": (await first.json())["id"]}
    for name, value in (("system", "Be long."), ("tools", [GET_WEATHER])):
        response = await stack.http.post("/v1/messages", json={"model": "m", "max_tokens": 5, "messages": USER,
                                                               name: value, "thread": continued})
        assert response.status == 400
        assert (await response.json())["error"]["message"].startswith(f"{name}: a continued thread keeps")
    assert len(stack.upstream_requests) == 1


async def test_a_thread_answered_while_redis_is_down_is_sent_whole_again_after(
        make_stack: StackFactory, redis_up: RedisServer) -> None:
    """The answer matters more than its thread: it goes out though the thread could not be kept,
    and the next turn, not found, is sent whole by the SDK."""
    stack = await make_stack(upstream_kind="anthropic", state_url=redis_up.url, state_timeout_seconds=0.5)
    stack.script.then(Reply(content="Hello."), Reply(content="Fine, thanks."))
    sent = Sent()
    async with sent.client(stack) as client:
        thread = client.beta.messages.thread(model="claude-test", max_tokens=512)
        redis_up.stop()
        try:
            assert await send(thread, False, "Hi.") == "Hello."
        finally:
            redis_up.start()
        assert await send(thread, False, "How are you?") == "Fine, thanks."
    assert [body["thread"]["type"] for body in sent.bodies] == ["create", "continue", "create"]
