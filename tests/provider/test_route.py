"""The provider reached through a real forward proxy (tinyproxy): the tool loop's calls of both
APIs, streamed and not, the pass-through and /readyz all go through it; NO_PROXY bypasses it."""

from __future__ import annotations

from typing import Any

import pytest
from pytest_aiohttp import AiohttpServer
from yarl import URL

from gateway.demo.model import Reply, ScriptedModel
from gateway.settings.model import Settings
from tests.conftest import STREAM, GatewayFactory, Script, Stack, StackFactory, free_port
from tests.provider.conftest import ProxyFactory, Tinyproxy


def _origin(stack: Stack) -> str:
    assert stack.upstream_server is not None
    return str(stack.upstream_server.make_url("")).rstrip("/")


def _script_a_tool_round(stack: Stack) -> None:
    stack.script.then(Reply(tool_calls=[("read_file", {"path": "notes.txt"})]), Reply(content="It says hi."))


@STREAM
async def test_the_tool_loop_of_both_apis_the_pass_through_and_readyz_go_through_the_proxy(
        make_stack: StackFactory, tinyproxy: Tinyproxy, stream: bool) -> None:
    stack = await make_stack(upstream_proxy=tinyproxy.url)
    origin = _origin(stack)

    _script_a_tool_round(stack)
    answer = await stack.ask(stream, messages=[{"role": "user", "content": "read notes.txt"}])
    assert answer.content == "It says hi."
    _script_a_tool_round(stack)
    response = await stack.respond(stream, input="read notes.txt")
    assert response.text == "It says hi."
    models = await stack.client.models.list()
    ready = await stack.http.get("/readyz")

    assert [model.id for model in models.data]
    assert ready.status == 200, await ready.text()
    assert tinyproxy.requests() == [  # each call of the engine's tool loop, in absolute form
        f"POST {origin}/v1/chat/completions HTTP/1.1", f"POST {origin}/v1/chat/completions HTTP/1.1",
        f"POST {origin}/v1/responses HTTP/1.1", f"POST {origin}/v1/responses HTTP/1.1",
        f"GET {origin}/v1/models HTTP/1.1",
        f"HEAD {origin}/v1/ HTTP/1.1",  # the readiness probe
    ]
    assert all(request.get("stream", False) is stream for request in stack.upstream_requests)


async def test_readyz_through_the_proxy_says_when_the_proxy_cannot_reach_the_provider(
        make_stack: StackFactory, tinyproxy: Tinyproxy) -> None:
    stack = await make_stack(upstream_proxy=tinyproxy.url)
    assert stack.upstream_server is not None
    await stack.upstream_server.close()

    ready = await stack.http.get("/readyz")
    chat = await stack.http.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user",
                                                                                            "content": "hi"}]})

    assert ready.status == 503
    body = await ready.json()
    assert body["status"] == "provider_unreachable"
    assert body["reason"] == "could not reach the provider: the proxy could not connect to it (it answered 500)"
    assert [line.split()[0] for line in tinyproxy.requests()] == ["HEAD", "POST"]
    assert chat.status == 502  # the proxy's own 500, passed on as the provider's answer
    assert (await chat.json())["error"]["message"].startswith("the provider answered 500")


async def _one_of_each(stack: Stack) -> dict[str, Any]:
    _script_a_tool_round(stack)
    answer = await stack.ask(False, messages=[{"role": "user", "content": "read notes.txt"}])
    models = await stack.client.models.list()
    ready = await stack.http.get("/readyz")
    return {"answer": answer.content, "models": bool(models.data), "ready": ready.status}


@pytest.mark.parametrize("variable", ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"])
async def test_the_environment_names_the_proxy_in_either_case(
        make_gateway: GatewayFactory, aiohttp_server: AiohttpServer, tinyproxy: Tinyproxy,
        monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    """The gateway reads the variables when it starts; the test's own openai client (which reads
    them too) goes to 127.0.0.1, which NO_PROXY keeps off the proxy, while the provider is named
    `localhost`. HTTP_PROXY counts too, as container platforms set it (curl alone leaves it out)."""
    monkeypatch.setenv(variable, tinyproxy.url)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    stack = await _stack_on_localhost(make_gateway, aiohttp_server)

    assert await _one_of_each(stack) == {"answer": "It says hi.", "models": True, "ready": 200}
    localhost = URL(_origin(stack)).with_host("localhost")
    assert tinyproxy.requests() == [f"POST {localhost}/v1/chat/completions HTTP/1.1"] * 2 + [
        f"GET {localhost}/v1/models HTTP/1.1", f"HEAD {localhost}/v1/ HTTP/1.1"]


@pytest.mark.parametrize(("lower", "upper"), [("http_proxy", "HTTP_PROXY"), ("all_proxy", "ALL_PROXY")])
async def test_the_lowercase_name_wins_over_the_uppercase_one(
        make_gateway: GatewayFactory, aiohttp_server: AiohttpServer, tinyproxy: Tinyproxy,
        monkeypatch: pytest.MonkeyPatch, lower: str, upper: str) -> None:
    monkeypatch.setenv(lower, tinyproxy.url)
    monkeypatch.setenv(upper, f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    stack = await _stack_on_localhost(make_gateway, aiohttp_server)

    assert await _one_of_each(stack) == {"answer": "It says hi.", "models": True, "ready": 200}
    assert len(tinyproxy.requests()) == 4


async def test_the_uppercase_no_proxy_keeps_the_provider_off_the_uppercase_proxy(
        make_gateway: GatewayFactory, aiohttp_server: AiohttpServer, tinyproxy: Tinyproxy,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", tinyproxy.url)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    stack = await _stack_on_localhost(make_gateway, aiohttp_server)

    assert await _one_of_each(stack) == {"answer": "It says hi.", "models": True, "ready": 200}
    assert tinyproxy.requests() == []


@pytest.mark.parametrize("no_proxy", ["127.0.0.1,localhost", "127.0.0.1,.localhost", "127.0.0.1, LOCALHOST.", "*",
                                      "example.com, 127.0.0.1, localhost"])
async def test_no_proxy_keeps_the_provider_off_the_proxy(
        make_gateway: GatewayFactory, aiohttp_server: AiohttpServer, make_tinyproxy: ProxyFactory,
        monkeypatch: pytest.MonkeyPatch, no_proxy: str) -> None:
    tinyproxy = await make_tinyproxy()
    monkeypatch.setenv("http_proxy", tinyproxy.url)
    monkeypatch.setenv("no_proxy", no_proxy)  # 127.0.0.1: the test's openai client reads it too
    stack = await _stack_on_localhost(make_gateway, aiohttp_server)

    assert await _one_of_each(stack) == {"answer": "It says hi.", "models": True, "ready": 200}
    assert tinyproxy.requests() == []


async def test_the_upstream_proxy_setting_direct_overrides_the_environment(
        make_gateway: GatewayFactory, aiohttp_server: AiohttpServer, tinyproxy: Tinyproxy,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("http_proxy", tinyproxy.url)
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    stack = await _stack_on_localhost(make_gateway, aiohttp_server, upstream_proxy="direct")

    assert await _one_of_each(stack) == {"answer": "It says hi.", "models": True, "ready": 200}
    assert tinyproxy.requests() == []


async def test_the_proxy_credentials_of_its_url_are_sent(make_stack: StackFactory,
                                                         make_tinyproxy: ProxyFactory) -> None:
    tinyproxy = await make_tinyproxy(auth=("gw", "s3cret"))
    stack = await make_stack(upstream_proxy=tinyproxy.url.replace("http://", "http://gw:s3cret@"))

    assert await _one_of_each(stack) == {"answer": "It says hi.", "models": True, "ready": 200}
    assert len(tinyproxy.requests()) == 4


async def _stack_on_localhost(make_gateway: GatewayFactory, aiohttp_server: AiohttpServer,
                              **overrides: Any) -> Stack:
    """A stack whose gateway names its provider `localhost` (the scripted model listens on 127.0.0.1)."""
    script = Script()
    model = ScriptedModel(script)
    server = await aiohttp_server(model.app())
    settings = Settings(port=0, upstream=str(server.make_url("/v1").with_host("localhost")), trajectory_store=False,
                        **overrides)
    gateway = await make_gateway(settings, provider_name="toolspan.scripted")
    return Stack(gateway.url, gateway.http, gateway.client, model, script, gateway.exporter, gateway.metrics,
                 gateway.observability, server)
