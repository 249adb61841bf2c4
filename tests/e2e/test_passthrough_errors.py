"""A provider's error on a pass-through route reaches the client in OpenAI's shape, as every error
of the gateway's does: a text, HTML, empty or otherwise shaped 4xx is wrapped keeping its status
and the provider's text; a 5xx is a 502 keeping the provider's message; an OpenAI-shaped 4xx goes
on byte for byte. Tried with the real `openai` client against a tiny provider that misbehaves,
each with its span and its count; success bodies still go byte for byte."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from typing import Any

import anthropic
import openai
import pytest
from aiohttp import web
from aiohttp.pytest_plugin import AiohttpServer

from gateway.settings.model import Settings
from telemetry import names
from tests.conftest import Gateway, GatewayFactory
from tests.e2e.test_faults import assert_error_spans, assert_openai_error, ended

PLAIN_404 = "404 page not found"
OPENAI_404 = json.dumps({"error": {"message": "The model 'gpt-9' does not exist", "type": "invalid_request_error",
                                   "param": None, "code": "model_not_found"}}).encode()
Answer = Callable[[web.Request], web.Response]


async def provider(aiohttp_server: AiohttpServer, make_gateway: GatewayFactory, answer: Answer) -> Gateway:
    """A gateway in front of a provider that answers every request with `answer`."""

    async def handle(request: web.Request) -> web.Response:
        return answer(request)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    server = await aiohttp_server(app)
    return await make_gateway(Settings(port=0, upstream=str(server.make_url("/v1")).rstrip("/"),
                                       upstream_kind="compatible"))


def counted(gateway: Gateway, status: int) -> float:
    return gateway.metric(names.METRIC_REQUESTS, **{names.LABEL_ROUTE: "/v1/{tail}", names.LABEL_STATUS: str(status)})


def checked(gateway: Gateway, exc: openai.APIStatusError, status: int, error_type: str) -> dict[str, Any]:
    """The OpenAI-shaped error body, with its span and its count."""
    assert exc.status_code == status
    error = assert_openai_error(exc.response.json(), type_=error_type)
    # The span names the gateway's error class: a refusal the provider made, or its failure.
    span_type = "upstream_refused" if status < 500 else "upstream_error"
    assert_error_spans(ended(gateway, exc.response.headers["x-trace-id"], chats=0), status, span_type)
    assert counted(gateway, status) == 1
    return error


LISTED = b'{"object":"list","data":[{"id":"m","object":"model","created":0,"owned_by":"x"}]}  \n'


def by_path(request: web.Request) -> web.Response:
    """A text 404 for the list, an OpenAI-shaped 404 for one model, and a success for another."""
    if request.path == "/v1/models":
        return web.Response(status=404, text=PLAIN_404)
    if request.path == "/v1/models/gpt-9":
        return web.Response(status=404, body=OPENAI_404, content_type="application/json",
                            headers={"x-request-id": "req_1"})
    return web.Response(body=LISTED, content_type="application/json")


async def test_a_text_404_is_an_openai_not_found_with_the_providers_text(
        aiohttp_server: AiohttpServer, make_gateway: GatewayFactory) -> None:
    gateway = await provider(aiohttp_server, make_gateway, by_path)
    with pytest.raises(openai.NotFoundError) as caught:
        await gateway.client.models.list()
    error = checked(gateway, caught.value, 404, "upstream_error")
    assert PLAIN_404 in error["message"]
    assert error["code"] == "upstream_404"
    assert PLAIN_404 in caught.value.message
    # An OpenAI-shaped 404 goes on byte for byte, and a success body too.
    with pytest.raises(openai.NotFoundError) as shaped:
        await gateway.client.models.retrieve("gpt-9")
    assert shaped.value.response.content == OPENAI_404
    assert shaped.value.response.headers["x-request-id"] == "req_1"
    assert shaped.value.code == "model_not_found"
    raw = await gateway.client.models.with_raw_response.retrieve("m")
    assert raw.content == LISTED


@pytest.mark.parametrize(("status", "body", "content_type", "expected"), [
    (503, b"upstream connect error or disconnect/reset before headers", "text/plain", "upstream connect error"),
    (502, b"<html><body><h1>502 Bad Gateway</h1></body></html>", "text/html", "502 Bad Gateway"),
    (500, b"", "text/plain", "(no body)"),
    (503, json.dumps({"error": {"message": "The engine is overloaded", "type": "server_error"}}).encode(),
     "application/json", "The engine is overloaded"),
], ids=["text-503", "html-502", "empty-500", "openai-503"])
async def test_a_5xx_is_a_502_keeping_the_providers_message(
        aiohttp_server: AiohttpServer, make_gateway: GatewayFactory, status: int, body: bytes, content_type: str,
        expected: str) -> None:
    gateway = await provider(aiohttp_server, make_gateway, lambda r: web.Response(
        status=status, body=body, content_type=content_type, headers={"Retry-After": "7"}))
    with pytest.raises(openai.InternalServerError) as caught:
        await gateway.client.models.retrieve("gpt-9")
    error = checked(gateway, caught.value, 502, "upstream_error")
    assert error["message"].startswith(f"the provider answered {status}: ")
    assert expected in error["message"]
    assert error["code"] == f"upstream_{status}"
    assert caught.value.response.headers["retry-after"] == "7"  # the provider's advice stays


async def test_a_4xx_of_another_json_shape_is_wrapped(aiohttp_server: AiohttpServer,
                                                       make_gateway: GatewayFactory) -> None:
    gateway = await provider(aiohttp_server, make_gateway, lambda r: web.json_response(
        {"detail": "Not authenticated"}, status=401))
    with pytest.raises(openai.AuthenticationError) as caught:
        await gateway.client.models.list()
    error = checked(gateway, caught.value, 401, "upstream_error")
    assert '{"detail": "Not authenticated"}' in error["message"]


async def test_a_compressed_text_error_is_read_as_its_text(aiohttp_server: AiohttpServer,
                                                           make_gateway: GatewayFactory) -> None:
    """The pass-through leaves bodies encoded; an error's text is read under its encoding."""
    gateway = await provider(aiohttp_server, make_gateway, lambda r: web.Response(
        status=404, body=gzip.compress(PLAIN_404.encode()), content_type="text/plain",
        headers={"Content-Encoding": "gzip"}))
    async with gateway.http.get("/v1/models", headers={"Accept-Encoding": "gzip"}) as answer:
        assert answer.status == 404
        error = assert_openai_error(await answer.json(), type_="upstream_error")
    assert PLAIN_404 in error["message"]


async def test_a_long_text_error_is_cut(aiohttp_server: AiohttpServer, make_gateway: GatewayFactory) -> None:
    gateway = await provider(aiohttp_server, make_gateway, lambda r: web.Response(status=400, text="x" * 500_000))
    with pytest.raises(openai.BadRequestError) as caught:
        await gateway.client.models.list()
    error = checked(gateway, caught.value, 400, "upstream_error")
    assert 1000 <= len(error["message"]) < 1100


async def test_an_overloaded_provider_is_a_529_to_anthropics_client_and_a_503_to_openais(
        aiohttp_server: AiohttpServer, make_gateway: GatewayFactory) -> None:
    """Anthropic's 529 on a pass-through route (count_tokens, models): each client gets the status its
    SDK retries, in its own shape."""
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    gateway = await provider(aiohttp_server, make_gateway, lambda r: web.json_response(overloaded, status=529))
    async with anthropic.AsyncAnthropic(base_url=gateway.url, api_key="sk-test", max_retries=0) as client:
        with pytest.raises(anthropic.OverloadedError) as refused:
            await client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi"}])
    assert refused.value.body == {"type": "error", "error": {  # type: ignore[comparison-overlap]
        "type": "overloaded_error", "message": "the provider answered 529: Overloaded"}}
    with pytest.raises(openai.InternalServerError) as caught:
        await gateway.client.models.list()
    error = checked(gateway, caught.value, 503, "upstream_error")
    assert (error["code"], error["message"]) == ("upstream_529", "the provider answered 529: Overloaded")
