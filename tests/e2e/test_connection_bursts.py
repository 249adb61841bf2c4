"""A burst of new connections, as the openai client's pool (up to 1,000 connections) opens them
(issue 53, item 14): the gateway's listener, and the built-in model's, which the gateway's tool
loop opens as many connections to, hold the whole burst until their event loop takes it. At
aiohttp's default backlog of 128 the kernel dropped the handshakes past it, and those requests
came seconds late (its retries 1, 3, 7 s on), past a client's timeout."""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from openai import AsyncOpenAI

from gateway.runtime.process import gateway
from gateway.settings.model import Settings
from tests.conftest import STREAM

BURST = 300  # over aiohttp's default backlog (128) and under Linux's cap (net.core.somaxconn, 4096)
SETTLE = 3.0  # seconds: a dropped handshake is tried again after 1 s, so a burst held whole settles long before
SETTINGS = Settings(port=0, max_concurrent_requests=BURST, upstream_max_connections=BURST)


def port_of(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port


@contextlib.contextmanager
def connections(port: int, count: int) -> Iterator[list[socket.socket]]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            sockets.append(sock)
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def established(sockets: list[socket.socket], within: float) -> list[socket.socket]:
    """The sockets whose handshake completes within `within` seconds, waited for without giving
    the event loop a turn: the server's loop is this one, so nothing is accepted meanwhile and
    every connection must wait in the listen queue."""
    by_fd = {sock.fileno(): sock for sock in sockets}
    poller = select.poll()
    for fd in by_fd:
        poller.register(fd, select.POLLOUT)
    done: list[socket.socket] = []
    deadline = time.monotonic() + within
    while len(done) < len(sockets) and (left := deadline - time.monotonic()) > 0:
        for fd, _ in poller.poll(left * 1000):
            poller.unregister(fd)
            if by_fd[fd].getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                done.append(by_fd[fd])
    return done


async def status_line(sock: socket.socket) -> bytes:
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    line = await reader.readline()
    writer.close()
    return line


@pytest.mark.parametrize("listener", ["gateway", "built-in model"])
async def test_a_burst_of_connections_waits_whole_to_be_accepted(listener: str) -> None:
    """`max_concurrent_requests` connections for the gateway, `upstream_max_connections` for the
    built-in model; every one then answered."""
    async with gateway(SETTINGS) as (url, _, model):
        assert model is not None
        assert model.base_url is not None
        port = port_of(url if listener == "gateway" else model.base_url)
        with connections(port, BURST) as sockets:
            held = established(sockets, SETTLE)  # the loop is held: nothing is accepted yet
            assert len(held) == BURST, f"{len(held)} of {BURST} connections held"
            answers = await asyncio.gather(*(status_line(sock) for sock in sockets))
        assert all(line.startswith(b"HTTP/1.1 ") for line in answers)


@STREAM
async def test_200_concurrent_requests_through_the_openai_client_are_all_answered(stream: bool) -> None:
    """openai's default client (httpx, 1,000 connections) sends all 200 at once; the gateway's tool
    loop then opens as many connections to the built-in model."""
    async with gateway(Settings(port=0)) as (url, _, _model), \
            AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60) as client:

        async def ask(n: int) -> str:
            messages: Any = [{"role": "user", "content": f"The weather in Lisbon? ({n})"}]
            if not stream:
                answer = await client.chat.completions.create(model="m", messages=messages)
                return answer.choices[0].message.content or ""
            text = ""
            async for chunk in await client.chat.completions.create(model="m", messages=messages, stream=True):
                text += "".join(choice.delta.content or "" for choice in chunk.choices)
            return text

        answers = await asyncio.gather(*(ask(n) for n in range(200)))
    assert len(answers) == 200
    assert all(answer.startswith("In Lisbon it is") for answer in answers)
