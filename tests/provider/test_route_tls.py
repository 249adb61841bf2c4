"""A provider over TLS with a private CA (`upstream_ca_bundle`), reached through a real proxy's
CONNECT tunnel (tinyproxy), and one that requires a client certificate (`upstream_client_cert`):
every route works with the setting, and without it every route says the same, naming it."""

from __future__ import annotations

import json
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme
from pytest_aiohttp import AiohttpServer

from gateway.demo.model import ScriptedModel
from gateway.settings.model import Settings
from tests.conftest import STREAM, GatewayFactory, Script, Stack
from tests.provider.conftest import Tinyproxy, _one_of_each, _script_a_tool_round

pytestmark = pytest.mark.slow  # a tinyproxy process

USER = [{"role": "user", "content": "read notes.txt"}]


@dataclass
class Provider:
    """The scripted model over TLS, and the files a gateway would be given for it."""

    port: int
    ca_bundle: Path  # the CA that signed the provider's certificate
    client_cert: Path  # a certificate the same CA issued to the gateway, with its key in it


async def _tls_provider(aiohttp_server: AiohttpServer, tmp_path: Path, script: Script,
                        require_client_cert: bool) -> tuple[Provider, ScriptedModel]:
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(server_context)
    if require_client_cert:
        server_context.verify_mode = ssl.CERT_REQUIRED
        ca.configure_trust(server_context)
    model = ScriptedModel(script)
    server = await aiohttp_server(model.app(), ssl=server_context)
    model.base_url = f"https://127.0.0.1:{server.port}"
    ca_bundle, client_cert = tmp_path / "ca.pem", tmp_path / "gateway.pem"
    ca.cert_pem.write_to_path(str(ca_bundle))
    issued = ca.issue_cert("toolspan-gateway")
    client_cert.write_bytes(issued.private_key_pem.bytes() + b"".join(blob.bytes() for blob in issued.cert_chain_pems))
    return Provider(server.port, ca_bundle, client_cert), model


async def _tls_stack(make_gateway: GatewayFactory, aiohttp_server: AiohttpServer, tmp_path: Path,
                     require_client_cert: bool = False, **overrides: Any) -> tuple[Stack, Provider]:
    script = Script()
    provider, model = await _tls_provider(aiohttp_server, tmp_path, script, require_client_cert)
    settings = Settings(port=0, upstream=f"https://127.0.0.1:{provider.port}/v1", trajectory_store=False,
                        **{key: (value(provider) if callable(value) else value) for key, value in overrides.items()})
    gateway = await make_gateway(settings, provider_name="toolspan.scripted")
    return Stack(gateway.url, gateway.http, gateway.client, model, script, gateway.exporter, gateway.metrics,
                 gateway.observability), provider


def _ca(provider: Provider) -> Path:
    return provider.ca_bundle


def _cert(provider: Provider) -> Path:
    return provider.client_cert


@STREAM
async def test_https_through_the_proxys_tunnel_with_the_ca_bundle_on_every_route(
        make_gateway: GatewayFactory, aiohttp_server: AiohttpServer, tmp_path: Path, tinyproxy: Tinyproxy,
        stream: bool) -> None:
    stack, provider = await _tls_stack(make_gateway, aiohttp_server, tmp_path, upstream_proxy=tinyproxy.url,
                                       upstream_ca_bundle=_ca)
    _script_a_tool_round(stack)
    answer = await stack.ask(stream, messages=USER)
    _script_a_tool_round(stack)
    response = await stack.respond(stream, input="read notes.txt")
    models = await stack.client.models.list()
    ready = await stack.http.get("/readyz")

    assert (answer.content, response.text) == ("It says hi.", "It says hi.")
    assert [model.id for model in models.data]
    assert ready.status == 200, await ready.text()
    assert len(stack.upstream_requests) == 4  # both tool loops' calls reached the provider
    tunnels = tinyproxy.requests()
    assert set(tunnels) == {f"CONNECT 127.0.0.1:{provider.port} HTTP/1.1"}  # only tunnels: TLS end to end
    assert len(tunnels) >= 3  # the engine's pool, the pass-through's session, the probe's own connection


async def _every_route(stack: Stack) -> dict[str, str]:
    """What each route says when the provider cannot be reached: the tool loop of both APIs (plain
    and streamed), the pass-through, and /readyz's reason."""
    said = {}
    for name, stream in (("chat", False), ("chat streamed", True), ("responses", False),
                         ("responses streamed", True)):
        path, body = (("/v1/chat/completions", {"messages": USER}) if name.startswith("chat")
                      else ("/v1/responses", {"input": "read notes.txt"}))
        answer = await stack.http.post(path, json={"model": "m", "stream": stream, **body})
        assert answer.status == 502, await answer.text()
        said[name] = (await answer.json())["error"]["message"]
    models = await stack.http.get("/v1/models")
    assert models.status == 502
    said["pass-through"] = (await models.json())["error"]["message"]
    ready = await stack.http.get("/readyz")
    assert ready.status == 503
    said["readyz"] = json.loads(await ready.text())["reason"]
    return said


def _the_same(said: dict[str, str], marker: str) -> str:
    """The one description every route gives (each route words its own lead-in before it)."""
    descriptions = {route: text[text.index(marker):] for route, text in said.items() if marker in text}
    assert descriptions.keys() == said.keys(), said
    [description] = set(descriptions.values())
    return description


async def test_without_the_ca_bundle_every_route_names_the_setting_in_the_same_words(
        make_gateway: GatewayFactory, aiohttp_server: AiohttpServer, tmp_path: Path, tinyproxy: Tinyproxy) -> None:
    stack, _ = await _tls_stack(make_gateway, aiohttp_server, tmp_path, upstream_proxy=tinyproxy.url)
    description = _the_same(await _every_route(stack), "cannot connect (TLS: CERTIFICATE_VERIFY_FAILED")
    assert "upstream_ca_bundle" in description
    assert stack.upstream_requests == []


@pytest.mark.parametrize("through_the_proxy", [False, True])
async def test_a_provider_that_requires_a_client_certificate_gets_the_configured_one(
        make_gateway: GatewayFactory, aiohttp_server: AiohttpServer, tmp_path: Path, tinyproxy: Tinyproxy,
        through_the_proxy: bool) -> None:
    proxy = {"upstream_proxy": tinyproxy.url} if through_the_proxy else {}
    stack, _ = await _tls_stack(make_gateway, aiohttp_server, tmp_path, require_client_cert=True,
                                upstream_ca_bundle=_ca, upstream_client_cert=_cert, **proxy)
    assert await _one_of_each(stack) == {"answer": "It says hi.", "models": True, "ready": 200}
    assert len(stack.upstream_requests) == 2
    assert bool(tinyproxy.requests()) is through_the_proxy


async def test_without_the_client_certificate_every_route_names_the_setting_in_the_same_words(
        make_gateway: GatewayFactory, aiohttp_server: AiohttpServer, tmp_path: Path) -> None:
    stack, _ = await _tls_stack(make_gateway, aiohttp_server, tmp_path, require_client_cert=True,
                                upstream_ca_bundle=_ca)
    # Over TLS 1.3 the refusal comes after the handshake: the gateway sees the connection close.
    description = _the_same(await _every_route(stack), "the provider closed the connection before answering")
    assert "upstream_client_cert" in description
    assert stack.upstream_requests == []
