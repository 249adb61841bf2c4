"""Hardening of the HTTP server (issue 10): body limits measured after decoding, client input that
used to end in a 500, aiohttp's own refusals in the OpenAI shape, read timeouts and load limits,
hang-ups during a pass-through answer, per-key pass-through routes, and a graceful shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import signal
import socket
import struct
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from pydantic import SecretStr, ValidationError
from pytest_aiohttp import AiohttpServer

from gateway.demo.model import Reply, ScriptedModel
from gateway.provider.client import Upstream
from gateway.runtime.process import gateway
from gateway.settings.model import Settings
from gateway.settings.parts import GatewayKey
from gateway.tools import Param, Tool, ToolRegistry
from telemetry import names
from tests.cli.test_main_process import Server
from tests.conftest import USER, Gateway, GatewayFactory, Stack, StackFactory, free_port
from tests.e2e.test_faults import assert_openai_error

DEADLINE = 5.0
HANG_UPS = 5
KEY = "tsk-alice-key-1"


# --- a provider that records what reaches it --------------------------------------------------------

@dataclass
class Received:
    path: str
    headers: dict[str, str]
    size: int  # body bytes that arrived (decoded)
    complete: bool  # the whole body arrived


@dataclass
class Provider:
    """A provider for pass-through tests: it reads every body to its end, keeps what it saw, and
    answers `{"received": size}`. /v1/held answers with b"first" and then holds its answer open
    for the test to write the rest, until the gateway hangs up; /v1/broken breaks off mid-answer."""

    received: list[Received] = field(default_factory=list)
    held: asyncio.Queue[web.StreamResponse] = field(default_factory=asyncio.Queue)
    dropped: asyncio.Queue[None] = field(default_factory=asyncio.Queue)  # one per held answer hung up on

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_get("/v1/held", self._held)
        app.router.add_get("/v1/broken", self._broken)
        app.router.add_route("*", "/v1/{tail:.*}", self._any)
        return app

    async def _any(self, request: web.Request) -> web.Response:
        size, complete = 0, False
        try:
            async for data in request.content.iter_any():
                size += len(data)
            complete = True
        finally:
            self.received.append(Received(request.path, dict(request.headers), size, complete))
        return web.json_response({"received": size})

    async def _held(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await response.prepare(request)
        await response.write(b"first")
        await self.held.put(response)
        try:
            await asyncio.Event().wait()
        finally:  # the server cancels a handler whose client (the gateway) hung up
            self.dropped.put_nowait(None)
        return response

    async def _broken(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await response.prepare(request)
        await response.write(b"the start of an answer")
        assert request.transport is not None
        request.transport.abort()  # as a provider's connection that drops
        return response


@dataclass
class Proxied:
    gateway: Gateway
    provider: Provider


async def proxied(aiohttp_server: AiohttpServer, make_gateway: GatewayFactory, **overrides: Any) -> Proxied:
    provider = Provider()
    server = await aiohttp_server(provider.app())
    settings = Settings(port=0, upstream=str(server.make_url("/v1")), **overrides)
    return Proxied(await make_gateway(settings), provider)


def address(gateway: Gateway | Stack) -> tuple[str, int]:
    server = gateway.http.server
    assert server.host is not None
    assert server.port is not None
    return server.host, server.port


async def raw_exchange(host: str, port: int, data: bytes) -> bytes:
    """Send `data` on a fresh connection and read until the server closes it."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), DEADLINE)
    finally:
        writer.close()


def parsed(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (lower-case names) and body of one HTTP/1.1 response."""
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


def nested(depth: int) -> str:
    """JSON text of arrays nested `depth` deep (as text: Python's json module stops near 1000)."""
    return "[" * depth + "1" + "]" * depth


# --- item 2: body limits, after decoding, on every route ------------------------------------------

BOMB = gzip.compress(b"\0" * (64 * 1024 * 1024))  # 65 KB on the wire, 64 MiB decoded


async def test_a_gzip_bomb_on_the_pass_through_is_a_413_and_never_reaches_the_provider(
        aiohttp_server: AiohttpServer, make_gateway: GatewayFactory) -> None:
    assert len(BOMB) < 100_000
    found = await proxied(aiohttp_server, make_gateway, upstream_api_key=SecretStr("sk-operator"))
    async with found.gateway.http.post("/v1/embeddings", data=BOMB, headers={"Content-Encoding": "gzip"}) as response:
        assert response.status == 413
        error = assert_openai_error(await response.json(), type_="invalid_request_error", code="body_too_large")
    assert str(Settings().max_body_bytes) in error["message"]
    assert all(not seen.complete for seen in found.provider.received)  # aborted, if it started at all
    assert all(seen.size <= Settings().max_body_bytes for seen in found.provider.received)


@pytest.mark.parametrize("encoding", ["gzip", "deflate", None])
async def test_a_pass_through_body_over_the_limit_is_a_413(aiohttp_server: AiohttpServer,
                                                          make_gateway: GatewayFactory, encoding: str | None) -> None:
    found = await proxied(aiohttp_server, make_gateway, max_body_bytes=4096)
    body = b"a" * 100_000
    sent = {"gzip": gzip.compress, "deflate": zlib.compress, None: bytes}[encoding](body)
    headers = {"Content-Encoding": encoding} if encoding else {}
    async with found.gateway.http.post("/v1/embeddings", data=sent, headers=headers) as response:
        assert response.status == 413
        error = assert_openai_error(await response.json(), type_="invalid_request_error", code="body_too_large")
    assert "4096" in error["message"]
    assert all(not seen.complete for seen in found.provider.received)


async def test_upload_routes_have_their_own_limit(aiohttp_server: AiohttpServer, make_gateway: GatewayFactory) -> None:
    found = await proxied(aiohttp_server, make_gateway, max_body_bytes=4096, max_upload_bytes=65536)
    async with found.gateway.http.post("/v1/uploads/upload_1/parts", data=b"p" * 50_000) as response:
        assert response.status == 200
        assert await response.json() == {"received": 50_000}
    async with found.gateway.http.post("/v1/embeddings", data=b"p" * 50_000) as response:
        assert response.status == 413
    async with found.gateway.http.post("/v1/files", data=b"p" * 70_000) as response:
        assert response.status == 413
        assert "65536" in (await response.json())["error"]["message"]


async def test_a_compressed_chat_body_is_measured_decoded(make_stack: StackFactory) -> None:
    stack = await make_stack(max_body_bytes=4096)
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 100_000}]}).encode()
    async with stack.http.post("/v1/chat/completions", data=gzip.compress(body),
                               headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}) as response:
        assert response.status == 413
        assert_openai_error(await response.json(), type_="invalid_request_error", code="body_too_large")
    assert stack.upstream_requests == []


# --- item 3: client input that was a 500 ------------------------------------------------------------

@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses", "/v1/tools/add/invoke", "/v1/echo"])
async def test_a_body_that_does_not_decode_is_a_400(stack: Stack, caplog: pytest.LogCaptureFixture,
                                                    path: str) -> None:
    async with stack.http.post(path, data=b"this is not gzip at all",
                               headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}) as response:
        assert response.status == 400
        error = assert_openai_error(await response.json(), type_="invalid_request_error", code="invalid_body")
    assert "gzip" in error["message"]
    assert "127.0.0.1" not in error["message"]  # the pass-through's never named the provider's address (item 13)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


CHAT_HEAD = '{"model": "m", "messages": [{"role": "user", "content": "hello"}], "metadata": {"deep": '


@pytest.mark.parametrize("depth", [63, 300, 1100])  # the body and `metadata` are two more levels
async def test_json_nested_too_deep_is_a_400_naming_the_limit(stack: Stack, depth: int) -> None:
    async with stack.http.post("/v1/chat/completions", data=CHAT_HEAD + nested(depth) + "}}",
                               headers={"Content-Type": "application/json"}) as response:
        assert response.status == 400
        error = assert_openai_error(await response.json(), type_="invalid_request_error", code="invalid_json")
    assert "64" in error["message"]
    assert stack.upstream_requests == []


async def test_json_at_the_depth_limit_is_accepted(stack: Stack) -> None:
    stack.script.then(Reply(content="fine"))
    async with stack.http.post("/v1/chat/completions", data=CHAT_HEAD + nested(62) + "}}",
                               headers={"Content-Type": "application/json"}) as response:
        assert response.status == 200
    assert json.dumps(stack.upstream_requests[0]["metadata"]).count("[") == 62


@pytest.mark.parametrize("route", ["invoke", "parse"])
async def test_deeply_nested_tool_arguments_are_a_400(stack: Stack, route: str) -> None:
    """As an object, `arguments` is part of the body (the same text inside a string is the tool's
    parse step's to judge, as a model's would be)."""
    payload = '{"arguments": {"a": ' + nested(1000) + ', "b": 1}}'
    async with stack.http.post(f"/v1/tools/add/{route}", data=payload,
                               headers={"Content-Type": "application/json"}) as response:
        assert response.status == 400
        error = assert_openai_error(await response.json(), type_="invalid_request_error", code="invalid_json")
    assert "64" in error["message"]


@pytest.mark.parametrize("accept", ["application/openmetrics-text; version=abc", "text/plain; version=x.y"])
async def test_metrics_with_a_malformed_accept_version_is_not_a_500(stack: Stack, accept: str) -> None:
    async with stack.http.get("/metrics", headers={"Accept": accept}) as response:
        assert response.status == 200
        assert b"toolspan_requests_in_flight" in await response.read()


# --- item 12: aiohttp's own refusals, OpenAI-shaped ------------------------------------------------

async def test_a_method_the_route_does_not_take_is_a_405_invalid_request(stack: Stack) -> None:
    async with stack.http.post("/metrics", data=b"") as response:
        assert response.status == 405
        assert "GET" in response.headers["Allow"]
        error = assert_openai_error(await response.json(), type_="invalid_request_error", code="method_not_allowed")
    assert "POST" in error["message"]


@pytest.fixture
async def served() -> AsyncIterator[str]:
    """The whole gateway as `toolspan serve` runs it (its server, not the test server), on the
    built-in model; yields host:port."""
    async with gateway(Settings(port=0, telemetry=False, header_read_timeout_seconds=0.5)) as (url, _, _):
        yield url.removeprefix("http://")


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"GARBAGE\r\n\r\n", 400),
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 20_000 + b"\r\n\r\n", 400),
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header Name: 1\r\n\r\n", 400),
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
], ids=["request-line", "header-too-long", "bad-header", "length-and-chunked"])
async def test_parser_refusals_are_openai_shaped(served: str, caplog: pytest.LogCaptureFixture,
                                                 request_bytes: bytes, status: int) -> None:
    host, _, port = served.partition(":")
    got, headers, body = parsed(await raw_exchange(host, int(port), request_bytes))
    assert got == status
    assert headers["content-type"].startswith("application/json")
    assert_openai_error(json.loads(body), type_="invalid_request_error", code="bad_request")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # a client's junk is not our error


# --- item 13: timeouts, pool and load limits, readiness, redirects ----------------------------------

async def test_a_connection_that_sends_its_head_too_slowly_is_closed(served: str) -> None:
    host, _, port = served.partition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    closed_by_server = False
    try:
        for _ in range(40):  # a header every 0.1 s: never a whole head, for 4 s
            writer.write(b"X-Drip: 1\r\n")
            await writer.drain()
            with contextlib.suppress(TimeoutError):
                if await asyncio.wait_for(reader.read(1), 0.1) == b"":
                    closed_by_server = True
                    break
    except ConnectionError:
        closed_by_server = True
    finally:
        writer.close()
    assert closed_by_server


async def test_a_stalled_body_is_a_408_and_leaves_nothing_in_flight(make_stack: StackFactory) -> None:
    stack = await make_stack(body_read_timeout_seconds=0.3)
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n{\"model\": ")
    status, _, body = parsed(await raw_exchange(*address(stack), head))
    assert status == 408
    assert_openai_error(json.loads(body), type_="invalid_request_error", code="request_timeout")
    assert stack.metric(names.METRIC_REQUESTS_IN_FLIGHT) == 0
    assert stack.upstream_requests == []


async def test_a_stalled_pass_through_body_is_a_408(aiohttp_server: AiohttpServer,
                                                    make_gateway: GatewayFactory) -> None:
    found = await proxied(aiohttp_server, make_gateway, body_read_timeout_seconds=0.3)
    head = b"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\nsome of it"
    status, _, body = parsed(await raw_exchange(*address(found.gateway), head))
    assert status == 408
    assert_openai_error(json.loads(body), type_="invalid_request_error", code="request_timeout")
    assert all(not seen.complete for seen in found.provider.received)
    assert found.gateway.metric(names.METRIC_REQUESTS_IN_FLIGHT) == 0


async def test_the_provider_pool_is_bounded(make_stack: StackFactory) -> None:
    stack = await make_stack(upstream_max_connections=1)
    stack.script.then(Reply(content="one two three", pause_after=2), Reply(content="second"))
    first = await stack.http.post("/v1/chat/completions", json={"model": "m", "messages": USER, "stream": True})
    await asyncio.wait_for(stack.model.paused.wait(), DEADLINE)
    second = asyncio.create_task(stack.client.chat.completions.create(model="m", messages=[
        {"role": "user", "content": "hello"}]))
    await asyncio.sleep(0.2)
    assert len(stack.upstream_requests) == 1  # the second waits for the one connection
    first.close()
    completion = await asyncio.wait_for(second, DEADLINE)
    assert completion.choices[0].message.content == "second"
    assert Settings().upstream_max_connections > 0  # bounded by default too


async def test_requests_beyond_the_concurrency_limit_are_a_503_with_retry_after(make_stack: StackFactory) -> None:
    stack = await make_stack(max_concurrent_requests=1)
    stack.script.then(Reply(content="one two three", pause_after=2))
    first = await stack.http.post("/v1/chat/completions", json={"model": "m", "messages": USER, "stream": True})
    await asyncio.wait_for(stack.model.paused.wait(), DEADLINE)
    async with stack.http.post("/v1/chat/completions", json={"model": "m", "messages": USER}) as response:
        assert response.status == 503
        assert int(response.headers["Retry-After"]) >= 1
        assert_openai_error(await response.json(), type_="server_error", code="overloaded")
    async with stack.http.get("/healthz") as response:  # operations stay answerable under load
        assert response.status == 200
    first.close()
    assert len(stack.upstream_requests) == 1


async def test_upstream_reachable_is_a_short_tcp_check(aiohttp_server: AiohttpServer) -> None:
    provider = await aiohttp_server(Provider().app())
    async with aiohttp.ClientSession() as session:
        up = Upstream(session, str(provider.make_url("/v1")), None, 5, 5)
        down = Upstream(session, f"http://127.0.0.1:{free_port()}/v1", None, 5, 5)
        assert await up.reachable()
        assert not await down.reachable()


async def test_readyz_is_not_ready_with_the_provider_unreachable(make_gateway: GatewayFactory) -> None:
    found = await make_gateway(Settings(port=0, upstream=f"http://127.0.0.1:{free_port()}/v1"))
    async with found.http.get("/readyz") as response:
        assert response.status == 503


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_the_chat_client_does_not_follow_provider_redirects(aiohttp_server: AiohttpServer,
                                                                  make_gateway: GatewayFactory, stream: bool) -> None:
    elsewhere = Provider()
    other = await aiohttp_server(elsewhere.app())

    async def moved(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(str(other.make_url("/v1/chat/completions")))

    redirecting = web.Application()
    redirecting.router.add_post("/v1/chat/completions", moved)
    provider = await aiohttp_server(redirecting)
    found = await make_gateway(Settings(port=0, upstream=str(provider.make_url("/v1")),
                                        upstream_api_key=SecretStr("sk-operator")))
    async with found.http.post("/v1/chat/completions", json={"model": "m", "messages": USER,
                                                             "stream": stream}) as response:
        assert response.status == 502
        error = assert_openai_error(await response.json(), type_="upstream_error")
    assert "307" in error["message"]
    assert elsewhere.received == []


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings"])
async def test_provider_failures_do_not_name_the_providers_address(make_gateway: GatewayFactory, path: str) -> None:
    port = free_port()
    found = await make_gateway(Settings(port=0, upstream=f"http://127.0.0.1:{port}/v1"))
    async with found.http.post(path, json={"model": "m", "messages": USER}) as response:
        assert response.status == 502
        error = assert_openai_error(await response.json(), type_="upstream_error")
    assert "could not reach the provider" in error["message"]
    assert str(port) not in error["message"]
    assert "127.0.0.1" not in error["message"]


async def test_a_provider_breaking_off_mid_pass_through_cuts_the_answer_short(
        aiohttp_server: AiohttpServer, make_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture) -> None:
    """Byte for byte means no error can be added to the answer: it ends unfinished, so that the
    client cannot take it for a whole one, and the gateway counts it as the provider's failure."""
    found = await proxied(aiohttp_server, make_gateway)
    async with found.gateway.http.get("/v1/broken") as response:
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()
        trace_id = response.headers["X-Trace-Id"]
    [span] = [s for s in found.gateway.spans(trace_id) if s.kind is SpanKind.SERVER]
    assert (span.attributes or {})[names.ATTR_ERROR_TYPE] == "upstream_error"
    assert found.gateway.metric(names.METRIC_REQUESTS, route="/v1/{tail}", status="500") == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


# --- item 14: a client hanging up during a pass-through answer ------------------------------------

async def test_hanging_up_mid_pass_through_is_never_a_500(aiohttp_server: AiohttpServer,
                                                         make_gateway: GatewayFactory,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """The race behind "2 of 30 hang-ups": the provider's next bytes reach the gateway in the
    same turn of the event loop as the client's reset, ahead of it. The gateway then writes to a
    connection that is closing before it has heard that it closed. Made certain here: the next
    bytes are written, then the client resets, with nothing in between."""
    found = await proxied(aiohttp_server, make_gateway)
    loop = asyncio.get_running_loop()
    for _ in range(HANG_UPS):
        client = socket.create_connection(address(found.gateway))
        client.sendall(b"GET /v1/held HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        client.setblocking(False)
        answer = await asyncio.wait_for(found.provider.held.get(), DEADLINE)
        seen = b""
        while b"first" not in seen:
            seen += await asyncio.wait_for(loop.sock_recv(client, 65536), DEADLINE)
        await answer.write(b"second")  # no suspension: the bytes are on their way to the gateway
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # a reset, right behind them
        # The gateway hangs up on the provider once it has handled (and counted) the hang-up.
        await asyncio.wait_for(found.provider.dropped.get(), DEADLINE)
    route = "/v1/{tail}"
    assert found.gateway.metric(names.METRIC_REQUESTS, route=route, status="500") == 0
    assert found.gateway.metric(names.METRIC_REQUESTS, route=route, status="499") == HANG_UPS
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


# --- item 8 (checked) and per-key pass-through routes -------------------------------------------------

ACCOUNT = {"OpenAI-Organization": "org-caller", "OpenAI-Project": "proj-caller"}


@pytest.mark.parametrize("overrides", [
    {"keys": {"alice": GatewayKey(key=SecretStr(KEY))}},
    {"upstream_api_key": SecretStr("sk-operator")},
    {"keys": {"alice": GatewayKey(key=SecretStr(KEY))}, "upstream_api_key": SecretStr("sk-operator")},
], ids=["gateway-keys", "own-key", "both"])
async def test_a_caller_cannot_choose_the_account_of_the_operators_key(
        aiohttp_server: AiohttpServer, make_gateway: GatewayFactory, overrides: dict[str, Any]) -> None:
    found = await proxied(aiohttp_server, make_gateway, **overrides)
    async with found.gateway.http.post("/v1/embeddings", json={"input": "x"},
                                       headers={"Authorization": f"Bearer {KEY}", **ACCOUNT}) as response:
        assert response.status == 200
    [seen] = found.provider.received
    sent = {k.lower() for k in seen.headers}
    assert not {"openai-organization", "openai-project"} & sent
    assert seen.headers.get("Authorization") in (None, "Bearer sk-operator")


async def test_without_keys_the_callers_account_headers_go_with_its_credentials(
        aiohttp_server: AiohttpServer, make_gateway: GatewayFactory) -> None:
    found = await proxied(aiohttp_server, make_gateway)
    async with found.gateway.http.post("/v1/embeddings", json={"input": "x"},
                                       headers={"Authorization": "Bearer sk-caller", **ACCOUNT}) as response:
        assert response.status == 200
    [seen] = found.provider.received
    assert (seen.headers["OpenAI-Organization"], seen.headers["Authorization"]) == ("org-caller", "Bearer sk-caller")


async def test_a_key_reaches_only_its_pass_through_routes(aiohttp_server: AiohttpServer,
                                                          make_gateway: GatewayFactory) -> None:
    keys = {"alice": GatewayKey(key=SecretStr(KEY), routes=["/v1/models", "/v1/embeddings/"]),
            "bob": GatewayKey(key=SecretStr("tsk-bob-key-22"))}
    found = await proxied(aiohttp_server, make_gateway, keys=keys)
    alice = {"Authorization": f"Bearer {KEY}"}
    for path, status in (("/v1/models", 200), ("/v1/models/gpt-4o", 200), ("/v1/embeddings", 200),
                         ("/v1/modelsx", 403), ("/v1/files", 403), ("/openai/v1/models", 403)):
        async with found.gateway.http.get(path, headers=alice) as response:
            assert response.status == status, path
            if status == 403:
                assert_openai_error(await response.json(), type_="permission_error", code="not_allowed")
    async with found.gateway.http.get("/v1/files", headers={"Authorization": "Bearer tsk-bob-key-22"}) as response:
        assert response.status == 200  # no list: every route
    assert [seen.path for seen in found.provider.received] == ["/v1/models", "/v1/models/gpt-4o", "/v1/embeddings",
                                                               "/v1/files"]


def test_a_route_prefix_without_its_slash_fails_at_start_up() -> None:
    """`v1/models` would match no path and refuse every route: the operator hears of it at once."""
    with pytest.raises(ValidationError, match="must be a path starting with '/'"):
        GatewayKey(key=SecretStr(KEY), routes=["v1/models"])


# --- graceful shutdown ---------------------------------------------------------------------------------

async def refuses_connections(port: int) -> bool:
    """Whether 127.0.0.1:port stops taking connections within DEADLINE (it stops listening a few
    turns of the event loop after its shutdown begins: there is nothing to await for that)."""
    for _ in range(int(DEADLINE / 0.01)):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except ConnectionError:  # refused, or reset when the listener closed with it in its backlog
            return True
        writer.close()
        await asyncio.sleep(0.01)
    return False


async def test_shutdown_lets_requests_finish_then_ends_the_rest_with_an_error_event() -> None:
    """As on SIGTERM: no new connections, a request that finishes within the grace period gets
    its answer, a stream still running after it gets an error event, and every span is exported
    (by a batch processor, which only exports when the tracer provider is shut down)."""
    exporter = InMemorySpanExporter()
    arrived, quick = asyncio.Event(), asyncio.Event()

    async def policy(body: dict[str, Any]) -> Reply:
        if body.get("stream"):
            return Reply(content="a long answer that never ends", pause_after=2)
        arrived.set()
        await quick.wait()
        return Reply(content="made it")

    settings = Settings(port=0, shutdown_grace_seconds=0.5)
    processor = BatchSpanProcessor(exporter, schedule_delay_millis=600_000)
    async with aiohttp.ClientSession() as session, contextlib.AsyncExitStack() as outer:
        url, _, model = await outer.enter_async_context(gateway(settings, processors=[processor], policy=policy))
        assert model is not None
        streamed = await session.post(f"{url}/v1/chat/completions",
                                      json={"model": "m", "messages": USER, "stream": True})
        await asyncio.wait_for(model.paused.wait(), DEADLINE)
        plain = asyncio.create_task(session.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": USER}))
        await asyncio.wait_for(arrived.wait(), DEADLINE)
        stopping = asyncio.create_task(outer.aclose())
        assert await refuses_connections(int(url.rsplit(":", 1)[1]))  # while both requests are under way
        quick.set()
        answer = await asyncio.wait_for(plain, DEADLINE)
        assert answer.status == 200
        assert (await answer.json())["choices"][0]["message"]["content"] == "made it"
        events = (await asyncio.wait_for(streamed.read(), DEADLINE)).decode()
        last = json.loads([line for line in events.split("\n") if line.startswith("data: {")][-1][6:])
        assert_openai_error(last, type_="server_error", code="shutting_down")
        await asyncio.wait_for(stopping, DEADLINE)
    servers = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]
    assert sorted((s.attributes or {}).get(names.ATTR_HTTP_STATUS, 0) for s in servers) == [200, 200]
    assert {(s.attributes or {}).get(names.ATTR_ERROR_TYPE) for s in servers} == {None, "server_error"}


async def test_shutdown_ends_a_wait_for_approval_as_it_ends_any_request() -> None:
    """A stream whose tool waits for a reviewer: past the grace period it gets the same error event
    as any other request still under way, and no approval is left pending."""
    pay = Tool(name="pay", function=lambda args: "paid", approval=True, parameters=[Param("to", "string")])
    settings = Settings(port=0, shutdown_grace_seconds=0.3, keepalive_seconds=0.05, trajectory_store=False)
    script = [Reply(tool_calls=[("pay", {"to": "ACME"})]), Reply(content="never reached")]
    async with aiohttp.ClientSession() as session, contextlib.AsyncExitStack() as outer:
        url, observability, _ = await outer.enter_async_context(
            gateway(settings, ToolRegistry([pay]), policy=lambda body: script.pop(0)))
        streamed = await session.post(f"{url}/v1/chat/completions",
                                      json={"model": "m", "messages": USER, "stream": True})
        async with asyncio.timeout(DEADLINE):  # the tool's keep-alive: the call waits for its reviewer
            while b"running tools" not in await streamed.content.readline():
                pass
        assert len(await observability.state.approvals.held()) == 1
        stopping = asyncio.create_task(outer.aclose())
        events = (await asyncio.wait_for(streamed.read(), DEADLINE)).decode()
        await asyncio.wait_for(stopping, DEADLINE)
    last = json.loads([line for line in events.split("\n") if line.startswith("data: {")][-1][6:])
    # The call ended with the wait (its outcome an error: not approved), so the round after it is
    # one "after tools": final, and resumable without asking again for what already ended.
    assert_openai_error(last, type_="server_error", code="upstream_failed_after_tools")
    assert last["error"]["message"].startswith("the gateway is shutting down")
    assert await observability.state.approvals.held() == []


async def test_sigterm_ends_toolspan_serve_gracefully(aiohttp_server: AiohttpServer) -> None:
    """`toolspan serve` itself: on SIGTERM a stream still running after the grace period gets an
    error event, and the process exits 0 without a traceback."""
    model = ScriptedModel(lambda body: Reply(content="a long answer that never ends", pause_after=2))
    provider = await aiohttp_server(model.app())
    server = Server("--upstream", str(provider.make_url("/v1")), env={"TOOLSPAN_SHUTDOWN_GRACE_SECONDS": "0.5"})
    try:
        url = await asyncio.to_thread(server.url)
        async with aiohttp.ClientSession() as session:
            streamed = await session.post(f"{url}/chat/completions", json={"model": "m", "messages": USER,
                                                                           "stream": True})
            await asyncio.wait_for(model.paused.wait(), DEADLINE)
            server.process.send_signal(signal.SIGTERM)
            events = (await asyncio.wait_for(streamed.read(), DEADLINE * 2)).decode()
        code = await asyncio.to_thread(server.process.wait, 20)
    finally:
        if server.process.poll() is None:
            server.process.kill()
    last = json.loads([line for line in events.split("\n") if line.startswith("data: {")][-1][6:])
    assert_openai_error(last, type_="server_error", code="shutting_down")
    assert code == 0
    server.reader.join(timeout=20)
    assert "Traceback" not in "".join(server.output)
