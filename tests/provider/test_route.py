"""How the gateway reaches its provider (gateway.provider.route), through a real forward proxy
(tinyproxy): the tool loop's calls of both APIs, streamed and not, the pass-through and /readyz all
go through it; the `upstream_proxy` setting wins over the environment (which proxy the environment
names, NO_PROXY included: tests/provider/test_proxies.py)."""

from __future__ import annotations

import pytest
from pytest_aiohttp import AiohttpServer

from tests.conftest import STREAM, GatewayFactory, StackFactory
from tests.provider.conftest import (
    ProxyFactory,
    Tinyproxy,
    _one_of_each,
    _origin,
    _script_a_tool_round,
    _stack_on_localhost,
)

pytestmark = pytest.mark.slow  # a tinyproxy process for each test


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
