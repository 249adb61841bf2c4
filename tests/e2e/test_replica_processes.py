"""Two replicas as an operator runs them: two `python -m gateway serve` processes of this checkout,
one real redis-server, one provider (a scripted model in the test). A mixed turn started on one
process is completed by its follow-up on the other, in both APIs, and a later request of the
conversation is restored on either; a verbatim retry of a call that failed on the other process is
classified and linked (its spans exported over OTLP/HTTP to a receiver here)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from pytest_aiohttp import AiohttpServer

from gateway.demo.model import Reply, ScriptedModel
from telemetry import names
from tests.conftest import free_port
from tests.e2e.redis_server import RedisServer
from tests.e2e.test_workers import Receiver, Toolspan, child_env, receiver

__all__ = ["receiver"]  # the OTLP receiver fixture, shared with test_workers

LISTENING = re.compile(r"listening on (http://\S+)/v1")
ASK = {"name": "ask_human", "description": "Ask the user", "parameters": {"type": "object", "properties": {}}}
TRAJECTORY = {"X-Trajectory-Id": "agent-42"}


def _results(body: dict[str, Any]) -> list[str]:
    if "messages" in body:
        return [m["content"] for m in body["messages"] if m.get("role") == "tool"]
    return [i["output"] for i in body["input"] if isinstance(i, dict) and i.get("type") == "function_call_output"]


def _last_user_text(body: dict[str, Any]) -> str:
    turns = body.get("messages") or body.get("input") or []
    texts = [t.get("content") for t in turns if isinstance(t, dict) and t.get("role") == "user"]
    return str(texts[-1]) if texts else ""


def model(body: dict[str, Any]) -> Reply:
    """Asked to ask: a mixed turn (the gateway's `echo`, the client's `ask_human`). Asked to retry:
    an `echo` call with a misnamed argument. Otherwise an answer that says whether the gateway's
    round is in the conversation it was sent."""
    results = _results(body)
    question = _last_user_text(body)
    if question == "echo, then ask me" and not results:
        return Reply(tool_calls=[("echo", {"text": "hi"}), ("ask_human", {})])
    if question == "misname it" and len(results) < 1:
        return Reply(tool_calls=[("echo", {"txt": "hi"})])
    if question == "misname it":
        return Reply(content="gave up")
    return Reply(content=f"saw {results}")


@pytest.fixture
async def two_processes(redis_up: RedisServer, receiver: tuple[Receiver, str],
                        aiohttp_server: AiohttpServer) -> AsyncIterator[tuple[str, str]]:
    provider = ScriptedModel(model)
    upstream = await aiohttp_server(provider.app())
    env = child_env(TOOLSPAN_STATE_URL=redis_up.url, OTEL_EXPORTER_OTLP_ENDPOINT=receiver[1],
                    OTEL_BSP_SCHEDULE_DELAY="100", TOOLSPAN_TRAJECTORY_STORE="false")
    started = [await Toolspan.start("--port", str(free_port()), "--upstream", str(upstream.make_url("/v1")),
                                    "--tools", "gateway.demo.tools:demo_registry", env=env) for _ in range(2)]
    try:
        first, second = [(await toolspan.line(LISTENING)).group(1) for toolspan in started]
        yield first, second
    finally:
        for toolspan in started:
            toolspan.process.terminate()
            assert await toolspan.exit_code() == 0, toolspan.output()


async def post(url: str, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.post(f"{url}/v1/{path}", json=body, headers=headers) as answer:
        assert answer.status == 200, await answer.text()
        return dict(await answer.json())


async def test_a_chat_turn_started_in_one_process_completes_in_the_other(two_processes: tuple[str, str]) -> None:
    one, other = two_processes
    tools = [{"type": "function", "function": ASK}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "echo, then ask me"}]
    first = (await post(one, "chat/completions", {"model": "m", "messages": messages, "tools": tools}))
    message = first["choices"][0]["message"]
    [call] = message["tool_calls"]
    assert call["function"]["name"] == "ask_human"
    assert call["id"].startswith("tspan_")
    messages += [message, {"role": "tool", "tool_call_id": call["id"], "content": "Paris"}]
    second = await post(other, "chat/completions", {"model": "m", "messages": messages, "tools": tools})
    assert second["choices"][0]["message"]["content"] == "saw ['hi', 'Paris']"
    messages += [second["choices"][0]["message"], {"role": "user", "content": "and now?"}]
    for replica in (one, other):  # later requests of the conversation, on either process
        later = await post(replica, "chat/completions", {"model": "m", "messages": messages, "tools": tools})
        assert later["choices"][0]["message"]["content"] == "saw ['hi', 'Paris']"


async def test_a_responses_turn_started_in_one_process_completes_in_the_other(
        two_processes: tuple[str, str]) -> None:
    one, other = two_processes
    tools = [{"type": "function", **ASK}]
    items: list[dict[str, Any]] = [{"role": "user", "content": "echo, then ask me"}]
    first = await post(one, "responses", {"model": "m", "input": items, "tools": tools, "store": False})
    [call] = [i for i in first["output"] if i["type"] == "function_call"]
    assert call["name"] == "ask_human"
    assert call["call_id"].startswith("tspan_")
    items += [*first["output"], {"type": "function_call_output", "call_id": call["call_id"], "output": "Paris"}]
    second = await post(other, "responses", {"model": "m", "input": items, "tools": tools, "store": False})
    [answer] = [i for i in second["output"] if i["type"] == "message"]
    assert answer["content"][0]["text"] == "saw ['hi', 'Paris']"


async def test_a_retry_of_a_call_that_failed_in_the_other_process_is_classified_and_linked(
        two_processes: tuple[str, str], receiver: tuple[Receiver, str]) -> None:
    one, other = two_processes
    question = {"model": "m", "messages": [{"role": "user", "content": "misname it"}]}
    traces = []
    for replica in (one, other):
        async with aiohttp.ClientSession() as http, \
                http.post(f"{replica}/v1/chat/completions", json=question, headers=TRAJECTORY) as answer:
            assert answer.status == 200
            traces.append(answer.headers["X-Trace-Id"])
    found = receiver[0]
    await found.until_requests(set(traces))

    def tool_call(trace: str) -> ProtoSpan:
        [span] = [s for _, s in found.spans if s.name == names.SPAN_TOOL_CALL and s.trace_id.hex() == trace]
        return span

    def attributes(span: ProtoSpan) -> dict[str, str]:
        return {a.key: a.value.string_value for a in span.attributes}

    # A tool.call span ends before its request's, so it was exported with it or before it.
    failed, retried = tool_call(traces[0]), tool_call(traces[1])
    assert attributes(failed)[names.ATTR_OUTCOME] == "rejected"
    assert names.ATTR_RETRY_KIND not in attributes(failed)
    assert attributes(retried)[names.ATTR_RETRY_KIND] == "verbatim"
    assert [(link.trace_id, link.span_id) for link in retried.links] == [(failed.trace_id, failed.span_id)]
