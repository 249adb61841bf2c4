"""Limits of gateway keys shared in a real Redis (issue 58): two gateway replicas, and `toolspan
serve --workers 2`, enforce one limit exactly (50 of 100 requests spread over both, never 50 on
each), and one key's requests at once across replicas; with Redis stopped mid-run, the rule of
`limits_when_state_down`: `open` lets requests through, counted and logged, `closed` refuses them
with a 503 `limits_unavailable` in the caller's API shape."""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer
from redis.asyncio import Redis

from gateway.demo.model import Reply
from gateway.settings.model import Settings
from gateway.tools import ToolRegistry
from telemetry import names
from tests.conftest import USER, GatewayFactory, Stack, StackFactory, free_port
from tests.e2e.redis_server import RedisServer
from tests.e2e.test_limits import waiting_registry
from tests.e2e.test_workers import CHAT, QUESTION, Receiver, Toolspan, child_env, fresh_connections

DB = 8  # a database of these tests' own on the session's redis-server, emptied around each test
UNCHECKED = "the gateway cannot check this key's limits now (its shared state is unreachable)"
Replicas = Callable[..., Awaitable[tuple[Stack, Stack]]]


@pytest.fixture
async def state_url(redis_up: RedisServer) -> AsyncIterator[str]:
    url = f"{redis_up.url.rsplit('/', 1)[0]}/{DB}"
    client = Redis.from_url(url)
    await client.flushdb()
    try:
        yield url
    finally:
        if redis_up.process is None:  # a test that stopped it and failed before starting it again
            redis_up.start()
        await client.flushdb()
        await client.aclose()


@pytest.fixture
def replicas(make_stack: StackFactory, make_gateway: GatewayFactory, tmp_path: Path, state_url: str) -> Replicas:
    """Two gateways on one Redis and one scripted provider, with the same settings."""
    async def build(registry: ToolRegistry | None = None, **overrides: Any) -> tuple[Stack, Stack]:
        first = await make_stack(registry, state_url=state_url, **overrides)
        settings = Settings(port=0, upstream=f"{first.model.base_url}/v1", state_url=state_url,
                            trajectory_store_path=tmp_path / "second.sqlite3", upstream_kind="compatible", **overrides)
        second = await make_gateway(settings, registry, provider_name="toolspan.scripted")
        return first, Stack(second.url, second.http, second.client, first.model, first.script, second.exporter,
                            second.metrics, second.observability, first.upstream_server)
    return build


async def through(stack: Stack) -> bool:
    """Whether one chat request got its answer (False: refused by a limit)."""
    try:
        await stack.ask(False, messages=USER)
    except openai.RateLimitError:
        return False
    return True


def refusals(stack: Stack, limit: str) -> float:
    return stack.metric(names.METRIC_LIMIT_REFUSALS, key=names.NO_KEY, limit=limit)


async def test_two_replicas_enforce_one_requests_per_minute_exactly(replicas: Replicas) -> None:
    one, other = await replicas(default_limits={"requests_per_minute": 50})
    one.script.then(*[Reply(content=f"answer {n}") for n in range(50)])
    answered = await asyncio.gather(*(through(one if n % 2 else other) for n in range(100)))
    assert sum(answered) == 50
    assert len(one.upstream_requests) == 50
    # Each replica had 50 requests, as many as the limit: counting alone, each would let all through.
    assert refusals(one, "requests_per_minute") + refusals(other, "requests_per_minute") == 50
    with pytest.raises(openai.RateLimitError) as refused:  # the minute is spent on both
        await one.ask(False, messages=USER)
    assert refused.value.response.headers["x-ratelimit-remaining-requests"] == "0"


async def test_a_keys_requests_at_once_are_counted_across_replicas(replicas: Replicas) -> None:
    release, started = asyncio.Event(), asyncio.Event()
    one, other = await replicas(registry=waiting_registry(release, started),
                                default_limits={"max_concurrent_requests": 1})
    one.script.then(Reply(tool_calls=[("wait", {"for": "me"})]), Reply(content="first"), Reply(content="second"))
    holding = asyncio.ensure_future(one.ask(False, messages=USER))
    await started.wait()  # under way on the first replica, in its tool
    with pytest.raises(openai.RateLimitError) as refused:
        await other.ask(False, messages=USER)
    assert refused.value.code == "max_concurrent_requests"
    release.set()
    assert (await holding).content == "first"
    assert (await other.ask(False, messages=USER)).content == "second"  # its place given back


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_redis_down_with_limits_open_lets_requests_through_counted_and_logged(
        replicas: Replicas, redis_up: RedisServer, caplog: pytest.LogCaptureFixture, stream: bool) -> None:
    one, other = await replicas(default_limits={"requests_per_minute": 2}, state_timeout_seconds=0.5)
    one.script.then(*[Reply(content=f"answer {n}") for n in range(6)])
    await one.ask(stream, messages=USER)
    redis_up.stop()
    try:
        with caplog.at_level(logging.WARNING, logger="toolspan.limits"):
            for replica in (one, other, other):  # past the bound: nothing counts them
                assert (await replica.ask(stream, messages=USER)).content is not None
    finally:
        redis_up.start()
    unavailable = names.METRIC_LIMITS_UNAVAILABLE
    assert (one.metric(unavailable), other.metric(unavailable)) == (1, 2)
    warned = [r.getMessage() for r in caplog.records if r.name == "toolspan.limits"]
    assert warned == ["limits not checked: the shared state is unreachable (limits_when_state_down = open)"] * 3
    # Back, and empty (no persistence): counted again from nothing, on both.
    await one.ask(stream, messages=USER)
    await other.ask(stream, messages=USER)
    with pytest.raises(openai.RateLimitError):
        await one.ask(stream, messages=USER)
    assert len(one.upstream_requests) == 6


async def test_redis_down_with_limits_closed_refuses_in_each_apis_shape(
        replicas: Replicas, redis_up: RedisServer) -> None:
    one, _ = await replicas(default_limits={"requests_per_minute": 5}, limits_when_state_down="closed",
                            state_timeout_seconds=0.5)
    one.script.then(Reply(content="before"), Reply(content="after"))
    assert (await one.ask(False, messages=USER)).content == "before"
    redis_up.stop()
    try:
        for stream in (False, True):
            with pytest.raises(openai.APIStatusError) as chat:
                await one.ask(stream, messages=USER)
            assert chat.value.status_code == 503
            assert chat.value.body == {"message": UNCHECKED, "type": "server_error", "param": None,
                                       "code": "limits_unavailable"}
            assert chat.value.response.headers["retry-after"] == "1"
            async with one.anthropic() as client:
                with pytest.raises(anthropic.APIStatusError) as messages:
                    await client.messages.create(model="claude-test", max_tokens=64, stream=stream,
                                                 messages=[{"role": "user", "content": "hello"}])
            assert messages.value.status_code == 503
            body: Any = messages.value.body
            assert (body["type"], body["error"]["type"]) == ("error", "api_error")
            assert body["error"]["message"] == UNCHECKED
    finally:
        redis_up.start()
    assert len(one.upstream_requests) == 1  # none of the refused went on
    assert one.metric(names.METRIC_LIMITS_UNAVAILABLE) == 0  # refused, not let through
    assert (await one.ask(False, messages=USER)).content == "after"


# --- `toolspan serve --workers 2` -----------------------------------------------------------------

@pytest.fixture
async def span_receiver(aiohttp_server: AiohttpServer) -> tuple[Receiver, str]:
    """An OTLP/HTTP endpoint (tests.e2e.test_workers' receiver): which worker served each request."""
    found = Receiver()
    app = web.Application()
    app.router.add_post("/v1/traces", found.traces)
    server = await aiohttp_server(app)
    return found, str(server.make_url("")).rstrip("/")


async def test_two_workers_enforce_one_requests_per_minute_exactly(
        state_url: str, span_receiver: tuple[Receiver, str]) -> None:
    port, sent = free_port(), 30
    with tempfile.TemporaryDirectory(prefix="tsl-") as run_dir:
        env = child_env(TOOLSPAN_STATE_URL=state_url, TOOLSPAN_DEFAULT_LIMITS=json.dumps({"requests_per_minute": 10}),
                        OTEL_EXPORTER_OTLP_ENDPOINT=span_receiver[1], OTEL_BSP_SCHEDULE_DELAY="100", TMPDIR=run_dir)
        toolspan = await Toolspan.start("--workers", "2", "--port", str(port), env=env)
        try:
            await toolspan.pids()
            async with fresh_connections() as http:  # each its own connection: the kernel picks a worker
                answers = await asyncio.gather(*(asked(http, f"http://127.0.0.1:{port}") for _ in range(sent)))
        finally:
            toolspan.process.terminate()
            assert await toolspan.exit_code() == 0
    assert sorted(status for status, _ in answers) == [200] * 10 + [429] * (sent - 10)
    served_by = await span_receiver[0].until_requests({trace for _, trace in answers})
    assert len(set(served_by.values())) == 2  # both workers answered, and 10 got through in all


async def asked(http: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with http.post(f"{url}{CHAT}", json=QUESTION) as response:
        await response.read()
        return response.status, response.headers["X-Trace-Id"]
