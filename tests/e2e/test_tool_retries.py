"""A provider failure after a gateway tool ran (issue 33, item 1): the real openai client, with its
default retries, must not make the gateway run the tool again. The gateway retries the provider
itself within the request; when the provider keeps failing, the client gets one final error
(`x-should-retry: false`, naming the tools that ran) and does not send the request again."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anthropic
import openai
import pytest
from agents import Agent, OpenAIProvider, RunConfig, Runner
from openai import NOT_GIVEN, AsyncOpenAI

from gateway.demo.model import Reply
from gateway.tools import Param, Tool, ToolRegistry
from telemetry import names
from tests.conftest import STREAM, TEST_KEY, USER, Stack, StackFactory

API = pytest.mark.parametrize("api", ["chat", "responses"])
FAILURES = {"429": Reply(status=429, error="rate limited", headers={"retry-after": "0"}),
            "500": Reply(status=500, error="the model is overloaded")}
FAILURE = pytest.mark.parametrize("failure", sorted(FAILURES))
CHARGE = Reply(tool_calls=[("charge", {"amount": 5})])


class Ledger:
    """A side-effecting gateway tool: every run charges once."""

    def __init__(self) -> None:
        self.charges: list[int] = []

    def charge(self, args: dict[str, Any]) -> str:
        self.charges.append(int(args["amount"]))
        return f"charged {args['amount']}"

    def registry(self) -> ToolRegistry:
        return ToolRegistry([Tool(name="charge", description="Charge the card", function=self.charge,
                                  parameters=[Param("amount", "integer", required=True)])])


class Provider:
    """The scripted model: it asks for the charge, then (once the charge's result is in the
    conversation) fails `failures` times before it answers."""

    def __init__(self, failure: Reply, failures: int, first: Reply = CHARGE) -> None:
        self.failure = failure
        self.failures_left = failures
        self.first = first  # the answer that asks for the charge

    def __call__(self, body: dict[str, Any]) -> Reply:
        if not any(m.get("role") == "tool" for m in body["messages"]):
            return self.first
        if self.failures_left > 0:
            self.failures_left -= 1
            return self.failure
        return Reply(content="Charged 5.")


@pytest.fixture
async def replaying_client(make_stack: StackFactory,
                           state: dict[str, Any]) -> AsyncIterator[tuple[Stack, Ledger, AsyncOpenAI]]:
    """The retrying client's stack, with each state store."""
    async with _client(make_stack, **state) as built:
        yield built


@pytest.fixture
async def retrying_client(make_stack: StackFactory) -> AsyncIterator[tuple[Stack, Ledger, AsyncOpenAI]]:
    """A stack whose only tool is the ledger's, and an openai client with its default retries."""
    async with _client(make_stack) as built:
        yield built


@asynccontextmanager
async def _client(make_stack: StackFactory, **overrides: Any) -> AsyncIterator[tuple[Stack, Ledger, AsyncOpenAI]]:
    ledger = Ledger()
    stack = await make_stack(ledger.registry(), **overrides)
    client = AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=TEST_KEY, timeout=20)
    assert client.max_retries == 2  # the default every app gets
    try:
        yield stack, ledger, client
    finally:
        await client.close()


def script(stack: Stack, provider: Provider) -> None:
    stack.script.then(*[provider] * 12)


async def call(client: AsyncOpenAI, api: str, stream: bool) -> str:
    """One app call, through the client's own retries: the answer's text."""
    if api == "chat":
        if not stream:
            completion = await client.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
            return completion.choices[0].message.content or ""
        chunks = await client.chat.completions.create(model="m", messages=USER, stream=True)  # type: ignore[arg-type]
        return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
    if not stream:
        return (await client.responses.create(model="m", input="charge me")).output_text
    events = await client.responses.create(model="m", input="charge me", stream=True)
    text = ""
    async for event in events:
        if event.type == "error":
            raise openai.APIError(event.message, None, body=None)  # type: ignore[arg-type]
        if event.type == "response.completed":
            text = event.response.output_text
    return text


def chat_spans(stack: Stack) -> list[Any]:
    return [s for s in stack.spans() if s.name.startswith(names.SPAN_CHAT_PREFIX + " ")]


@API
@STREAM
@FAILURE
async def test_the_tool_runs_once_when_the_round_after_it_fails_once(
        retrying_client: tuple[Stack, Ledger, AsyncOpenAI], api: str, stream: bool, failure: str) -> None:
    stack, ledger, client = retrying_client
    script(stack, Provider(FAILURES[failure], 1))
    assert await call(client, api, stream) == "Charged 5."
    assert ledger.charges == [5]
    assert len(stack.upstream_requests) == 3  # the tool's round, the failure, the retry
    # Each attempt has its chat span; the retry says which attempt it is, and is counted.
    attempts = [(s.attributes or {}).get(names.ATTR_UPSTREAM_ATTEMPT) for s in chat_spans(stack)]
    assert sorted(attempts, key=str) == [2, None, None]
    assert stack.metric(names.METRIC_UPSTREAM_RETRIES, **{names.LABEL_MODEL: "m"}) == 1
    route = "/v1/chat/completions" if api == "chat" else "/v1/responses"
    assert stack.metric(names.METRIC_REQUESTS, **{names.LABEL_ROUTE: route, names.LABEL_STATUS: "200"}) == 1


@API
@STREAM
async def test_a_provider_that_keeps_failing_gets_one_final_error_and_no_client_retry(
        retrying_client: tuple[Stack, Ledger, AsyncOpenAI], api: str, stream: bool) -> None:
    stack, ledger, client = retrying_client
    script(stack, Provider(FAILURES["429"], 99))
    with pytest.raises(openai.APIError) as caught:
        await call(client, api, stream)
    error = caught.value
    if api == "chat" and stream:
        # The provider's first chunk (the assistant's role) went out as it came, so the 200 is out:
        # the failure is the stream's last event, which no SDK retries.
        assert not isinstance(error, openai.APIStatusError)
        detail = error.body
    else:
        assert isinstance(error, openai.APIStatusError)
        assert error.status_code == 429
        assert error.response.headers["x-should-retry"] == "false"
        assert "retry-after" not in error.response.headers
        body = error.response.json()
        assert set(body) == {"error"}
        detail = body["error"]
    assert isinstance(detail, dict)
    assert set(detail) == {"message", "type", "param", "code"}
    assert detail["code"] == "upstream_failed_after_tools"
    assert "(charge)" in detail["message"]
    assert "rate limited" in detail["message"]
    assert ledger.charges == [5]
    # One request from the client: the tool's round and three attempts of the next (1 + 2 retries).
    assert len(stack.upstream_requests) == 4
    assert len([s for s in stack.spans() if s.parent is None]) == 1
    attempts = sorted((s.attributes or {}).get(names.ATTR_UPSTREAM_ATTEMPT, 1) for s in chat_spans(stack))
    assert attempts == [1, 1, 2, 3]


@pytest.mark.parametrize("use_responses", [True, False], ids=["responses", "chat"])
@STREAM
@FAILURE
async def test_an_agents_sdk_run_charges_once(retrying_client: tuple[Stack, Ledger, AsyncOpenAI],
                                              use_responses: bool, stream: bool, failure: str) -> None:
    """The first round's 429 goes to the SDK as it came (nothing ran yet: its retry is harmless);
    the failure after the charge is the gateway's to retry."""
    stack, ledger, client = retrying_client
    stack.script.then(FAILURES["429"])
    script(stack, Provider(FAILURES[failure], 1))
    provider = OpenAIProvider(openai_client=client, use_responses=use_responses)
    agent = Agent(name="cashier", instructions="Be brief.", model="m")
    config = RunConfig(model_provider=provider, tracing_disabled=True)
    if stream:
        running = Runner.run_streamed(agent, "charge me", run_config=config)
        async for _ in running.stream_events():
            pass
        final = running.final_output
    else:
        final = (await Runner.run(agent, "charge me", run_config=config)).final_output
    assert final == "Charged 5."
    assert ledger.charges == [5]
    assert len([s for s in stack.spans() if s.parent is None]) == 2  # the SDK sent the request twice
    assert len(stack.upstream_requests) == 4  # the 429; the charge's round, the 500 and the retry


@API
@STREAM
async def test_a_replay_after_the_final_error_resumes_without_running_the_tool_again(
        replaying_client: tuple[Stack, Ledger, AsyncOpenAI], api: str, stream: bool) -> None:
    """The app sends the failed call again itself (its own retry loop): the gateway goes on from the
    round that failed, with the charge's result as it was, and charges nothing more."""
    stack, ledger, client = replaying_client
    provider = Provider(FAILURES["429"], 3)  # the three attempts of the first run fail
    script(stack, provider)
    with pytest.raises(openai.APIError) as caught:
        await call(client, api, stream)
    assert "resumes after them" in caught.value.message
    assert ledger.charges == [5]
    before = len(stack.upstream_requests)
    assert await call(client, api, stream) == "Charged 5."
    assert ledger.charges == [5]
    [replayed] = stack.upstream_requests[before:]  # only the round that had failed
    results = [m["content"] for m in replayed.get("messages", []) if m.get("role") == "tool"]
    results += [i["output"] for i in replayed.get("input", []) if i.get("type") == "function_call_output"]
    assert results == ["charged 5"]
    # Read once: the same call a third time is a new one, and charges again.
    assert await call(client, api, stream) == "Charged 5."
    assert ledger.charges == [5, 5]


async def test_a_retry_after_past_the_time_bound_ends_the_retries_at_once(make_stack: StackFactory) -> None:
    """The provider asks for 30 s; the gateway may wait 1 s in all: it does not wait, and says so."""
    async with _client(make_stack, upstream_retry_max_seconds=1.0) as (stack, ledger, client):
        script(stack, Provider(Reply(status=429, error="slow down", headers={"retry-after": "30"}), 99))
        with pytest.raises(openai.RateLimitError) as caught:
            await call(client, "chat", False)
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert ledger.charges == [5]
    assert len(stack.upstream_requests) == 2  # the tool's round and one attempt of the next
    assert stack.metric(names.METRIC_UPSTREAM_RETRIES, **{names.LABEL_MODEL: "m"}) == 0


# What a provider's answer carries beside its body: its request id (Anthropic's and OpenAI's names).
PROVIDER_HEADERS = {"request-id": "req_first_round", "x-request-id": "req_first_round"}


class StreamFailed(Exception):
    """A stream that ended in an error event, which the openai client leaves to the app to raise."""


@dataclass(frozen=True)
class Replayed:
    """What the app's client made of an answer: its text, its headers, the prompt tokens it counts."""

    text: str
    headers: Mapping[str, str]
    input_tokens: int


async def answered(stack: Stack, client: AsyncOpenAI, api: str, stream: bool) -> Replayed:
    """One app call with the API's official client (its default retries): what it made of the answer."""
    if api == "messages":
        return await _anthropic_answer(stack, stream)
    if api == "chat":
        raw = await client.chat.completions.with_raw_response.create(
            model="m", messages=USER, stream=stream, stream_options={"include_usage": True} if stream else NOT_GIVEN)
        if not stream:
            completion = raw.parse()
            assert completion.usage is not None
            return Replayed(completion.choices[0].message.content or "", raw.headers, completion.usage.prompt_tokens)
        chunks = [chunk async for chunk in raw.parse()]
        usage = chunks[-1].usage
        assert usage is not None
        return Replayed("".join(c.choices[0].delta.content or "" for c in chunks if c.choices), raw.headers,
                        usage.prompt_tokens)
    raw_response = await client.responses.with_raw_response.create(model="m", input="charge me", stream=stream)
    if not stream:
        response = raw_response.parse()
    else:
        events = [event async for event in raw_response.parse()]
        if events[-1].type == "error":  # the stream's 200 was out: the failure is its last event
            raise StreamFailed(events[-1].message)
        [response] = [e.response for e in events if e.type == "response.completed"]
    assert response.usage is not None
    text = "".join(part.text for item in response.output if item.type == "message" for part in item.content
                   if part.type == "output_text")
    return Replayed(text, raw_response.headers, response.usage.input_tokens)


async def _anthropic_answer(stack: Stack, stream: bool) -> Replayed:
    async with anthropic.AsyncAnthropic(base_url=stack.url, api_key=TEST_KEY, timeout=20) as client:
        assert client.max_retries == 2  # the default every app gets
        request: dict[str, Any] = {"model": "m", "max_tokens": 64, "messages": USER}
        if not stream:
            raw = await client.messages.with_raw_response.create(**request)
            message = await raw.parse()
            headers: Mapping[str, str] = raw.headers
        else:
            async with client.messages.stream(**request) as streamed:
                message = await streamed.get_final_message()
                headers = streamed.response.headers
    text = "".join(block.text for block in message.content if block.type == "text")
    return Replayed(text, headers, message.usage.input_tokens)


async def failed(stack: Stack, client: AsyncOpenAI, api: str, stream: bool) -> str:
    """One app call that ends in the gateway's final error: its message."""
    with pytest.raises((openai.APIError, anthropic.APIError, StreamFailed)) as caught:
        await answered(stack, client, api, stream)
    return str(caught.value)


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
@STREAM
async def test_every_kept_round_comes_back_as_the_provider_sent_it(
        replaying_client: tuple[Stack, Ledger, AsyncOpenAI], api: str, stream: bool) -> None:
    """The round a failed request did is kept (in memory, or in Redis) and read back whole: its
    answer, headers (aiohttp names them with its case-insensitive string type, which the record's
    encoder refused: a streamed Messages request then lost its rounds, and its replay ran the tool
    again), usage and what the stream showed."""
    stack, ledger, client = replaying_client
    first = Reply(content="Charging.", tool_calls=[("charge", {"amount": 5})], headers=PROVIDER_HEADERS)
    script(stack, Provider(FAILURES["429"], 3, first))
    assert "resumes after them" in await failed(stack, client, api, stream)
    assert ledger.charges == [5]
    failing, before = stack.upstream_requests[-1], len(stack.upstream_requests)
    replayed = await answered(stack, client, api, stream)
    assert ledger.charges == [5]
    # One provider call, the one that had failed, to the byte: the kept round is the conversation it continues.
    assert stack.upstream_requests[before:] == [failing]
    assert replayed.text.endswith("Charged 5.")
    assert replayed.input_tokens == 20  # the kept round's and the new one's
    if stream:  # the stream showed the kept round again, under its own answer's head
        assert replayed.text == "Charging.Charged 5."
        assert replayed.headers["request-id"] == "req_first_round"
