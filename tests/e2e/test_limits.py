"""Limits of gateway keys (issue 58), through the official clients: each limit refuses at its bound
and not before, in the shape of the caller's API with the headers its SDK backs off by; concurrent
requests are counted exactly; two keys never share a bucket; a window spent inside the tool loop
ends it with a 429 that says why, the rounds already run kept."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.demo.model import Reply
from gateway.settings.model import Settings
from gateway.tools import Param, Tool, ToolRegistry
from telemetry import names
from tests.conftest import TEST_KEY, USER, GatewayFactory, Stack, StackFactory, metric_sum
from tests.e2e.redis_server import RedisServer

OTHER_KEY = "sk-other-key-0001"
KEYS = {"alice": {"key": TEST_KEY}, "bob": {"key": OTHER_KEY}}


def answers(stack: Stack, count: int) -> None:
    stack.script.then(*[Reply(content=f"answer {n}") for n in range(count)])


def refusals(stack: Stack, limit: str, key: str = names.NO_KEY) -> float:
    return stack.metric(names.METRIC_LIMIT_REFUSALS, key=key, limit=limit)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_requests_per_minute_refuses_past_its_bound_in_chats_shape(make_stack: StackFactory,
                                                                         stream: bool) -> None:
    stack = await make_stack(default_limits={"requests_per_minute": 2})
    answers(stack, 2)
    first = await stack.ask(stream, messages=USER)
    second = await stack.ask(stream, messages=USER)
    assert (first.headers["x-ratelimit-limit-requests"], first.headers["x-ratelimit-remaining-requests"]) == ("2", "1")
    assert second.headers["x-ratelimit-remaining-requests"] == "0"
    assert second.headers["anthropic-ratelimit-requests-remaining"] == "0"
    with pytest.raises(openai.RateLimitError) as refused:
        await stack.ask(stream, messages=USER)
    response = refused.value.response
    assert 0 < int(response.headers["retry-after"]) <= 60
    assert response.headers["x-ratelimit-remaining-requests"] == "0"
    assert refused.value.code == "requests_per_minute"
    assert "requests_per_minute (2 of 2 used)" in refused.value.message
    assert len(stack.upstream_requests) == 2  # the refused request never reached the provider
    assert refusals(stack, "requests_per_minute") == 1


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_responses_and_messages_are_refused_in_their_own_shapes(make_stack: StackFactory, stream: bool) -> None:
    stack = await make_stack(default_limits={"requests_per_minute": 1})
    answers(stack, 1)
    await stack.respond(stream, input="hello")
    with pytest.raises(openai.RateLimitError):
        await stack.respond(stream, input="hello")
    async with stack.anthropic() as client:
        with pytest.raises(anthropic.RateLimitError) as refused:
            await client.messages.create(model="test-model", max_tokens=64, messages=USER, stream=stream)
    body: Any = refused.value.body
    assert body["error"]["type"] == "rate_limit_error"
    assert refused.value.response.headers["anthropic-ratelimit-requests-remaining"] == "0"


async def test_200_concurrent_requests_against_a_limit_of_50_let_exactly_50_through(make_stack: StackFactory) -> None:
    stack = await make_stack(default_limits={"requests_per_minute": 50})
    answers(stack, 50)

    async def one() -> bool:
        try:
            await stack.ask(False, messages=USER)
        except openai.RateLimitError:
            return False
        return True

    through = await asyncio.gather(*(one() for _ in range(200)))
    assert sum(through) == 50
    assert len(stack.upstream_requests) == 50
    assert refusals(stack, "requests_per_minute") == 150


async def test_two_keys_never_share_a_bucket(make_stack: StackFactory) -> None:
    stack = await make_stack(keys=KEYS, default_limits={"requests_per_minute": 1})
    answers(stack, 2)
    await stack.ask(False, messages=USER)
    with pytest.raises(openai.RateLimitError):
        await stack.ask(False, messages=USER)
    bob = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=OTHER_KEY, max_retries=0)
    async with bob:
        await bob.chat.completions.create(model="test-model", messages=USER)  # bob's own minute
    assert refusals(stack, "requests_per_minute", key="alice") == 1
    assert refusals(stack, "requests_per_minute", key="bob") == 0


async def test_a_keys_own_limit_wins_over_the_default(make_stack: StackFactory) -> None:
    stack = await make_stack(keys={"alice": {"key": TEST_KEY, "requests_per_minute": 3}, "bob": {"key": OTHER_KEY}},
                             default_limits={"requests_per_minute": 1})
    answers(stack, 3)
    for _ in range(3):
        await stack.ask(False, messages=USER)
    with pytest.raises(openai.RateLimitError):
        await stack.ask(False, messages=USER)


def waiting_registry(release: asyncio.Event, started: asyncio.Event) -> ToolRegistry:
    async def wait(args: dict[str, Any]) -> str:
        started.set()
        await release.wait()
        return "done"

    return ToolRegistry([Tool(name="wait", description="Wait", function=wait, parameters=[Param("for", "string")])])


async def test_the_sdks_own_retry_honours_retry_after(make_stack: StackFactory) -> None:
    release, started, told_to_wait = asyncio.Event(), asyncio.Event(), asyncio.Event()
    stack = await make_stack(registry=waiting_registry(release, started),
                             default_limits={"max_concurrent_requests": 1})
    stack.script.then(Reply(tool_calls=[("wait", {"for": "me"})]), Reply(content="first"), Reply(content="second"))
    holding = asyncio.ensure_future(stack.ask(False, messages=USER))
    await started.wait()  # the first request is under way, in its tool

    async def heard(response: httpx.Response) -> None:
        if response.status_code == 429:
            assert response.headers["retry-after"] == "1"
            told_to_wait.set()

    transport = httpx.AsyncClient(event_hooks={"response": [heard]})
    patient = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=TEST_KEY, max_retries=2, http_client=transport)
    async with patient:
        second = asyncio.ensure_future(patient.chat.completions.create(model="test-model", messages=USER))
        await told_to_wait.wait()  # refused once: the SDK waits the second it was told, then asks again
        release.set()
        answer = await asyncio.wait_for(second, 20)
    assert answer.choices[0].message.content == "second"
    assert (await holding).content == "first"
    assert refusals(stack, "max_concurrent_requests") == 1


async def test_tokens_per_day_spent_inside_the_tool_loop_ends_it_with_a_429_that_says_why(
        make_stack: StackFactory) -> None:
    # Each provider call uses 15 tokens (10 in, 5 out); the second would take the day past 20.
    stack = await make_stack(default_limits={"tokens_per_day": 20})
    stack.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 2})]), Reply(content="3"))
    with pytest.raises(openai.RateLimitError) as refused:
        await stack.ask(False, messages=USER)
    assert "tokens_per_day (15 of 20 used)" in refused.value.message
    headers = refused.value.response.headers
    assert headers["x-should-retry"] == "false"  # the day's end is too far for an SDK's retries
    assert int(headers["retry-after"]) > 60
    assert len(stack.upstream_requests) == 1  # the tool ran; the second call never went
    assert stack.metric(names.METRIC_TOOL_CALLS, tool="add", outcome="ok") == 1
    with pytest.raises(openai.RateLimitError) as again:  # nearly spent: refused before anything runs
        await stack.ask(False, messages=USER)
    assert again.value.code == "tokens_per_day"
    assert len(stack.upstream_requests) == 1


async def test_a_money_budget_counts_by_the_models_price(make_stack: StackFactory) -> None:
    # 10 input and 5 output tokens at 1 and 2 per million: 20 millionths a call.
    stack = await make_stack(default_limits={"budget_per_month": 0.00003},
                             prices={"test-*": {"input": 1.0, "output": 2.0}})
    answers(stack, 2)
    await stack.ask(False, messages=USER)
    await stack.ask(False, messages=USER)  # 20 of 30 spent: it may still go
    with pytest.raises(openai.RateLimitError) as refused:
        await stack.ask(False, messages=USER)
    assert "budget_per_month (0.00004 of 0.00003 used)" in refused.value.message
    assert refused.value.code == "budget_per_month"
    assert len(stack.upstream_requests) == 2


async def test_tool_calls_per_minute_counts_the_gateways_calls(make_stack: StackFactory) -> None:
    stack = await make_stack(default_limits={"tool_calls_per_minute": 2})
    stack.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 2}), ("add", {"a": 2, "b": 3})]),
                      Reply(tool_calls=[("add", {"a": 3, "b": 4})]), Reply(content="done"))
    with pytest.raises(openai.RateLimitError) as refused:
        await stack.ask(False, messages=USER)
    assert refused.value.code == "tool_calls_per_minute"
    assert stack.metric(names.METRIC_TOOL_CALLS, tool="add") == 2  # the third never ran


async def test_a_keys_max_rounds_is_the_lower_round_limit(make_stack: StackFactory) -> None:
    stack = await make_stack(default_limits={"max_rounds": 1})
    stack.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 2})]), Reply(content="3"))
    answer = await stack.ask(False, messages=USER)
    assert answer.content == "3"
    assert stack.upstream_requests[-1]["tool_choice"] == "none"  # the last call allowed no tools


async def test_without_limits_no_quota_headers(make_stack: StackFactory) -> None:
    stack = await make_stack()
    answers(stack, 1)
    answer = await stack.ask(False, messages=USER)
    assert not any(name.startswith("x-ratelimit") for name in answer.headers)


async def test_the_rounds_run_before_a_limit_are_kept_for_the_request_sent_again(
        make_stack: StackFactory, make_gateway: GatewayFactory, redis_up: RedisServer, tmp_path: Path) -> None:
    # Two replicas on one Redis: the first's key has spent its day inside the loop, the second has
    # no limits; the same request sent to the second goes on after the round the first ran.
    limited = await make_stack(state_url=redis_up.url, default_limits={"tokens_per_day": 20})
    limited.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 2})]), Reply(content="3"))
    with pytest.raises(openai.RateLimitError) as refused:
        await limited.ask(False, messages=USER)
    assert "resumes after them" in refused.value.message
    settings = Settings(port=0, upstream=f"{limited.model.base_url}/v1", state_url=redis_up.url,
                        trajectory_store_path=tmp_path / "second.sqlite3", upstream_kind="compatible")
    free = await make_gateway(settings, provider_name="toolspan.scripted")
    answer = await free.client.chat.completions.create(model="test-model", messages=USER)
    assert answer.choices[0].message.content == "3"
    assert len(limited.upstream_requests) == 2  # the first round's call was not made again
    assert limited.metric(names.METRIC_TOOL_CALLS, tool="add") == 1
    assert free.metrics is not None
    assert metric_sum(free.metrics, names.METRIC_TOOL_CALLS, tool="add") == 0  # the tool did not run twice


async def test_a_stream_refused_inside_the_loop_ends_with_an_error_event(make_stack: StackFactory) -> None:
    # The first call uses 35 tokens (30 in); the second, estimated at 30 more, would pass 50.
    stack = await make_stack(default_limits={"tokens_per_day": 50})
    stack.script.then(Reply(tool_calls=[("add", {"a": 1, "b": 2})], usage=(30, 5)), Reply(content="3"))
    with pytest.raises(openai.APIError) as failed:
        await stack.ask(True, messages=USER)
    assert "tokens_per_day" in str(failed.value)
    assert len(stack.upstream_requests) == 1


async def ask_in(stack: Stack, api: str, stream: bool) -> None:
    """One request in `api` through its official client, read to its end."""
    if api == "chat":
        await stack.ask(stream, messages=USER)
    elif api == "responses":
        await stack.respond(stream, input="hello")
    else:
        async with stack.anthropic() as client:
            if stream:
                async with client.messages.stream(model="test-model", max_tokens=64, messages=USER) as events:
                    await events.get_final_message()
            else:
                await client.messages.create(model="test-model", max_tokens=64, messages=USER)


SPENDING = [("tokens_per_minute", 150, {}), ("tokens_per_day", 150, {}), ("tokens_per_month", 150, {}),
            # 100 input tokens at 1 per million: 100 millionths a call
            ("budget_per_day", 0.00015, {"test-*": {"input": 1.0, "output": 1.0}}),
            ("budget_per_month", 0.00015, {"test-*": {"input": 1.0, "output": 1.0}})]


@pytest.mark.parametrize(("limit", "bound", "prices"), SPENDING, ids=[s[0] for s in SPENDING])
@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_each_spending_limit_refuses_once_spent_and_not_before(
        make_stack: StackFactory, limit: str, bound: float, prices: dict[str, Any], api: str, stream: bool) -> None:
    stack = await make_stack(default_limits={limit: bound}, prices=prices)
    stack.script.then(Reply(content="one", usage=(100, 0)), Reply(content="two", usage=(100, 0)))
    await ask_in(stack, api, stream)  # 100 of 150
    await ask_in(stack, api, stream)  # still under: it goes, and takes the window to 200
    refused_type = anthropic.RateLimitError if api == "messages" else openai.RateLimitError
    with pytest.raises(refused_type):
        await ask_in(stack, api, stream)
    assert len(stack.upstream_requests) == 2
    assert refusals(stack, limit) == 1


async def test_answers_say_what_is_left_of_the_minutes_tokens(make_stack: StackFactory) -> None:
    stack = await make_stack(default_limits={"tokens_per_minute": 150})
    stack.script.then(Reply(content="one", usage=(100, 0)), Reply(content="two", usage=(10, 0)))
    first = await stack.ask(False, messages=USER)
    second = await stack.ask(False, messages=USER)
    assert first.headers["x-ratelimit-limit-tokens"] == second.headers["x-ratelimit-limit-tokens"] == "150"
    # What was left as each was admitted: the first call's 100 tokens counted once it answered.
    assert (first.headers["x-ratelimit-remaining-tokens"], second.headers["x-ratelimit-remaining-tokens"]) == (
        "150", "50")
    assert second.headers["anthropic-ratelimit-tokens-remaining"] == "50"
