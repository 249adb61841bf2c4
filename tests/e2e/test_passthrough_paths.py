"""The pass-through never reaches a path of the provider's host outside the surface it was given
(/v1/ under the base URL; /openai/ on an Azure resource). A dot segment decoded once is refused; so
is one that a second decoding makes (`%252e%252e` is `%2e%2e` to the gateway and `..` once the
outgoing URL is normalised, or once the provider decodes it again), and those a provider might read
as one (`..\\`, `..;`). A real loopback provider records every request that reaches it."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer
from yarl import URL

from gateway.settings.model import Settings
from tests.conftest import Gateway, GatewayFactory

PROVIDER_KEY = "sk-provider-key"


@dataclass
class Recorder:
    """A provider that answers every path with 200 and keeps the paths it was asked for, as sent."""

    paths: list[str] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        self.paths.append(request.raw_path)
        return web.json_response({"path": request.raw_path})


async def gateway_before(recorder: Recorder, aiohttp_server: AiohttpServer, make_gateway: GatewayFactory,
                         **settings: str) -> Gateway:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", recorder.handle)
    server = await aiohttp_server(app)
    base = "" if settings.get("upstream_kind") == "azure" else "/v1"
    return await make_gateway(Settings(port=0, upstream=str(server.make_url(base)).rstrip("/"),
                                       upstream_api_key=PROVIDER_KEY, **settings))


async def get(gateway: Gateway, path: str) -> tuple[int, str]:
    # The whole URL as it is: `gateway.http.get(path)` would decode and resolve it first.
    async with gateway.http.session.get(URL(gateway.url + path, encoded=True)) as answer:
        return answer.status, await answer.text()


@pytest.mark.parametrize("path", [
    "/v1/%252e%252e/_log", "/v1/%252E%252E/_log", "/v1/models/%252e%252e/%252e%252e/metrics",
    "/v1/%252e/_log", "/v1/.%252e/_log", "/v1/%25252e%25252e/_log", "/v1/..%255c_log", "/v1/..%5c_log",
    "/v1/..;/_log", "/v1/%252e%252e;x/_log", "/v1/models%252f%252e%252e%252f_log",
    "/v1/responses/%252e%252e", "/v1/responses/%252e%252e/input_items",
])
async def test_a_path_that_would_leave_v1_is_refused_and_never_sent(
        aiohttp_server: AiohttpServer, make_gateway: GatewayFactory, path: str) -> None:
    recorder = Recorder()
    gateway = await gateway_before(recorder, aiohttp_server, make_gateway)
    status, body = await get(gateway, path)
    assert (status, recorder.paths) == (404, [])
    assert '"code": "invalid_path"' in body
    assert PROVIDER_KEY not in body


@pytest.mark.parametrize("path", ["/openai/%252e%252e/_log", "/openai/deployments/%252e%252e/%252e%252e/_log",
                                  "/openai/..;/_log", "/openai/v1/responses/%252e%252e"])
async def test_an_azure_path_that_would_leave_openai_is_refused_and_never_sent(
        aiohttp_server: AiohttpServer, make_gateway: GatewayFactory, path: str) -> None:
    recorder = Recorder()
    gateway = await gateway_before(recorder, aiohttp_server, make_gateway, upstream_kind="azure")
    status, body = await get(gateway, path)
    assert (status, recorder.paths) == (404, [])
    assert '"code": "invalid_path"' in body


@pytest.mark.parametrize(("path", "sent"), [
    ("/v1/models", "/v1/models"), ("/v1/files/file-abc/content", "/v1/files/file-abc/content"),
    ("/v1/models/v1.2..3", "/v1/models/v1.2..3"), ("/v1/models/%2e%2e%2e", "/v1/models/..."),
    ("/v1/models/...", "/v1/models/..."),
])
async def test_other_paths_go_on_as_they_came(aiohttp_server: AiohttpServer, make_gateway: GatewayFactory,
                                              path: str, sent: str) -> None:
    recorder = Recorder()
    gateway = await gateway_before(recorder, aiohttp_server, make_gateway)
    assert (await get(gateway, path))[0] == 200
    assert recorder.paths == [sent]
