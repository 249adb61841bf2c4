"""Which proxy the environment names for the provider (gateway.provider.proxies), as curl reads the
variables but for the uppercase HTTP_PROXY, through a real forward proxy (tinyproxy): either case of
a name, the lowercase one first, NO_PROXY in its forms."""

from __future__ import annotations

import pytest
from pytest_aiohttp import AiohttpServer
from yarl import URL

from tests.conftest import GatewayFactory, free_port
from tests.provider.conftest import ProxyFactory, Tinyproxy, _one_of_each, _origin, _stack_on_localhost

pytestmark = pytest.mark.slow  # a tinyproxy process for each test


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
