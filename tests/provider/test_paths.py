"""An upstream URL without its /v1 (issue 35): the provider's 404 says the path the gateway called
and how to fix the URL, in the client's error and once in the log. A tiny aiohttp server plays the
provider: it has only /v1 routes, as OpenAI does."""

from __future__ import annotations

import logging
from typing import Any

import openai
import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from gateway.settings.model import Settings
from tests.conftest import STREAM, USER, GatewayFactory

HINT = "the upstream URL usually ends in /v1: set TOOLSPAN_UPSTREAM=https://host/v1"
API = pytest.mark.parametrize("api", ["chat", "responses"])


async def _only_v1(request: web.Request) -> web.Response:
    if request.path.startswith("/v1/"):
        return web.json_response({"object": "list", "data": []})
    return web.Response(status=404, text="404 page not found")  # as many servers say it: not JSON


@pytest.fixture
async def provider(aiohttp_server: AiohttpServer) -> str:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", _only_v1)
    server = await aiohttp_server(app)
    return str(server.make_url("")).rstrip("/")


async def _ask(client: openai.AsyncOpenAI, api: str, stream: bool) -> None:
    if api == "chat":
        answer: Any = await client.chat.completions.create(model="m", messages=USER, stream=stream)
    else:
        answer = await client.responses.create(model="m", input="hi", stream=stream)
    if stream:
        async for _ in answer:
            pass


@API
@STREAM
async def test_a_404_names_the_path_called_and_the_missing_v1(make_gateway: GatewayFactory, provider: str,
                                                             caplog: pytest.LogCaptureFixture, api: str,
                                                             stream: bool) -> None:
    gateway = await make_gateway(Settings(port=0, upstream=provider))  # no /v1
    path = "/chat/completions" if api == "chat" else "/responses"
    with caplog.at_level(logging.INFO, logger="toolspan"):
        for _ in range(3):  # the log says it once, every client is told
            with pytest.raises(openai.NotFoundError) as refused:
                await _ask(gateway.client, api, stream)
            message = refused.value.body["message"]  # type: ignore[index]
            assert message == f"the provider answered 404 to POST {path}; {HINT}"
            assert refused.value.code == "upstream_404"
    said = [r.getMessage() for r in caplog.records if "usually ends in /v1" in r.getMessage()]
    assert said == [f"the provider answered 404 to POST {provider}{path}; the upstream URL usually ends in /v1: "
                    f"set TOOLSPAN_UPSTREAM={provider}/v1"]


async def test_a_404_at_a_v1_path_names_the_path_without_a_hint(make_gateway: GatewayFactory,
                                                                aiohttp_server: AiohttpServer) -> None:
    async def unknown_model(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "The model 'm' does not exist", "type": "invalid_request_error",
                                            "param": "model", "code": "model_not_found"}}, status=404)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", unknown_model)
    server = await aiohttp_server(app)
    gateway = await make_gateway(Settings(port=0, upstream=str(server.make_url("/v1"))))
    with pytest.raises(openai.NotFoundError) as refused:
        await gateway.client.chat.completions.create(model="m", messages=USER)
    assert refused.value.body == {  # the provider's type and code, with the path said
        "message": "the provider answered 404 to POST /v1/chat/completions (The model 'm' does not exist)",
        "type": "invalid_request_error", "param": "model", "code": "model_not_found"}


async def test_the_pass_through_says_it_too(make_gateway: GatewayFactory, provider: str,
                                            caplog: pytest.LogCaptureFixture) -> None:
    gateway = await make_gateway(Settings(port=0, upstream=provider))
    with caplog.at_level(logging.INFO, logger="toolspan"):
        for _ in range(2):
            with pytest.raises(openai.NotFoundError) as refused:
                await gateway.client.models.list()
            assert refused.value.body["message"] == f"the provider answered 404 to GET /models; {HINT}"  # type: ignore[index]
    assert len([r for r in caplog.records if "usually ends in /v1" in r.getMessage()]) == 1


async def test_get_root_points_the_way(make_gateway: GatewayFactory, provider: str) -> None:
    gateway = await make_gateway(Settings(port=0, upstream=f"{provider}/v1"))
    async with gateway.http.get("/") as answer:
        assert answer.status == 200
        body = await answer.json()
    assert body["links"] == {"api": "/v1", "tools": "/v1/tools", "page": "/ui", "mcp": "/mcp", "metrics": "/metrics",
                             "health": "/healthz", "ready": "/readyz", "openapi": "/openapi.json"}
    async with gateway.http.get("/", headers={"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}) as answer:
        assert (answer.status, answer.content_type) == (200, "text/html")
        page = await answer.text()
    for path in ("/ui", "/v1", "/metrics", "/healthz"):
        assert f'<a href="{path}">' in page
