"""The server's private aiohttp members, fenced (issue 34): with them, a request aiohttp's parser
refuses gets an OpenAI-shaped error; where this aiohttp lacks one, the gateway still serves, with
aiohttp's own text/plain refusal and one warning naming what is missing."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from gateway.http.server import GatewayRunner

Served = Callable[[], Awaitable[int]]


async def _hello(_: web.Request) -> web.Response:
    return web.json_response({"ok": True})


@pytest.fixture
async def serve() -> AsyncIterator[Served]:
    runners: list[web.AppRunner] = []

    async def start() -> int:
        app = web.Application()
        app.router.add_get("/", _hello)
        runner = GatewayRunner(app)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return int(runner.addresses[0][1])

    yield start
    for runner in runners:
        await runner.cleanup()


async def _exchange(port: int, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    async with asyncio.timeout(5):
        answer = await reader.read()  # the server closes after a refusal, and after Connection: close
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode().split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


def _server_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "toolspan.server" and r.levelno == logging.WARNING]


BAD_REQUEST_LINE = b"NOT HTTP AT ALL\r\n\r\n"
GOOD = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


async def test_with_aiohttp_as_expected_a_refusal_is_openai_shaped(serve: Served,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    port = await serve()
    status, headers, body = await _exchange(port, BAD_REQUEST_LINE)
    assert status == 400
    assert headers["content-type"].startswith("application/json")
    assert json.loads(body)["error"]["type"] == "invalid_request_error"
    assert "toolspan.server" not in {r.name for r in caplog.records if r.levelno >= logging.WARNING}


async def test_a_server_without_its_private_kwargs_falls_back_with_one_warning(
        serve: Served, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    original = web.AppRunner._make_server

    class Renamed(web.Server):  # as an aiohttp release that renamed `_kwargs` would make it
        handler_kwargs: dict[str, Any]

        def __call__(self) -> web.RequestHandler:
            return web.RequestHandler(self, loop=self._loop, **self.handler_kwargs)

    async def without_kwargs(self: web.AppRunner) -> Any:
        made = await original(self)
        setattr(made, "handler_kwargs", made.__dict__.pop("_kwargs"))  # noqa: B010 (not an attribute of Server)
        made.__class__ = Renamed
        return made

    monkeypatch.setattr(web.AppRunner, "_make_server", without_kwargs)
    port = await serve()
    warnings = _server_warnings(caplog)
    assert len(warnings) == 1
    assert "no Server._kwargs" in warnings[0]
    status, headers, _ = await _exchange(port, BAD_REQUEST_LINE)
    assert status == 400
    assert headers["content-type"].startswith("text/plain")  # aiohttp's own answer
    status, _, body = await _exchange(port, GOOD)
    assert status == 200
    assert json.loads(body) == {"ok": True}


async def test_a_request_handler_of_another_shape_falls_back_when_the_runner_is_made(
        serve: Served, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def handle_error(self: web.RequestHandler, request: web.BaseRequest, status: int = 500,
                     exc: BaseException | None = None, message: str | None = None, extra: int = 0) -> web.Response:
        return web.Response(status=status, text="plain refusal")

    monkeypatch.setattr(web.RequestHandler, "handle_error", handle_error)
    port = await serve()
    warnings = _server_warnings(caplog)
    assert len(warnings) == 1
    assert "RequestHandler.handle_error does not take" in warnings[0]
    status, _, body = await _exchange(port, GOOD)
    assert status == 200
    status, _, body = await _exchange(port, BAD_REQUEST_LINE)
    assert status == 400
    assert body == b"plain refusal"
