"""A proxy that refuses the gateway (407: credentials; 403: a destination it does not allow) is
named as the proxy on every route, in the same words, whether it forwards the requests (an
http:// provider) or tunnels them (CONNECT, an https:// provider): never "the provider answered 407"."""

from __future__ import annotations

from pathlib import Path

import pytest
from pytest_aiohttp import AiohttpServer

from tests.conftest import GatewayFactory, StackFactory
from tests.provider.conftest import ProxyFactory
from tests.provider.test_route_tls import _ca, _every_route, _the_same, _tls_stack

pytestmark = pytest.mark.slow  # a tinyproxy process for each test

_CREDENTIALS = "it wants credentials, or not these: give them in the proxy URL as http://user:password@host:port"


async def test_a_forwarding_proxy_that_wants_credentials_is_named_on_every_route(
        make_stack: StackFactory, make_tinyproxy: ProxyFactory) -> None:
    """Only without credentials: tinyproxy answers wrong ones with a 401 (and WWW-Authenticate),
    which on a forwarded request cannot be told from the provider's own 401, and stays its."""
    tinyproxy = await make_tinyproxy(auth=("gw", "s3cret"))
    stack = await make_stack(upstream_proxy=tinyproxy.url)

    description = _the_same(await _every_route(stack), "the proxy refused")
    assert description == f"the proxy refused to connect to the provider (407: {_CREDENTIALS})"
    assert stack.upstream_requests == []


@pytest.mark.parametrize(("sent", "status"), [("", 407), ("gw:wrong@", 401)], ids=["none", "wrong"])
async def test_a_tunnelling_proxy_that_wants_credentials_is_named_on_every_route(
        make_gateway: GatewayFactory, aiohttp_server: AiohttpServer, tmp_path: Path,
        make_tinyproxy: ProxyFactory, sent: str, status: int) -> None:
    tinyproxy = await make_tinyproxy(auth=("gw", "s3cret"))
    stack, _ = await _tls_stack(make_gateway, aiohttp_server, tmp_path, upstream_ca_bundle=_ca,
                                upstream_proxy=tinyproxy.url.replace("http://", f"http://{sent}"))

    description = _the_same(await _every_route(stack), "the proxy refused")
    assert description == f"the proxy refused to connect to the provider ({status}: {_CREDENTIALS})"
    assert stack.upstream_requests == []


async def test_a_proxy_that_does_not_allow_the_providers_port_is_named_on_every_route(
        make_gateway: GatewayFactory, aiohttp_server: AiohttpServer, tmp_path: Path,
        make_tinyproxy: ProxyFactory) -> None:
    tinyproxy = await make_tinyproxy(connect_ports=(1,))  # CONNECT to port 1 only: the provider's gets 403
    stack, provider = await _tls_stack(make_gateway, aiohttp_server, tmp_path, upstream_ca_bundle=_ca,
                                       upstream_proxy=tinyproxy.url)

    description = _the_same(await _every_route(stack), "the proxy refused")
    assert description == "the proxy refused to connect to the provider (403: it does not allow this destination)"
    assert set(tinyproxy.requests()) == {f"CONNECT 127.0.0.1:{provider.port} HTTP/1.1"}
    assert stack.upstream_requests == []
