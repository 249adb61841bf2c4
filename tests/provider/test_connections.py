"""The engine's connections to the provider (gateway.provider.connections), against providers that speak
HTTP at the socket level: kept-alive connections, answers of every framing, informational
answers, and providers that break the rules; TLS with a certificate authority of the test's own."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
import trustme
from aiohttp import web
from opentelemetry.semconv.attributes import http_attributes
from pydantic import SecretStr
from pytest_aiohttp import AiohttpServer

from gateway.errors import UpstreamTimeout, UpstreamUnavailable
from gateway.provider import connections, http1
from gateway.provider.client import Upstream
from gateway.provider.connections import ProviderConnectionError, ProviderConnections
from gateway.settings.model import Settings
from telemetry import names
from tests.conftest import GatewayFactory

DEADLINE = 5.0
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"a\": true}"
JSON = {"Content-Type": "application/json"}

# What the provider does once a request has arrived: writes what it returns, then keeps the
# connection for the next request (True) or closes it (False).
Answering = Callable[[bytes, asyncio.StreamWriter], Awaitable[bool]]


@dataclass
class RawProvider:
    """A provider at the socket level, answering each request with `answering`."""

    answering: Answering
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    server: asyncio.Server | None = None
    handlers: list[tuple[asyncio.Task[None], asyncio.StreamWriter]] = field(default_factory=list)

    @property
    def url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self.handlers.append((task, writer))  # type: ignore[arg-type]
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                if not await self.answering(request, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def raw_provider() -> AsyncIterator[Callable[[Answering], Awaitable[RawProvider]]]:
    started: list[RawProvider] = []

    async def start(answering: Answering) -> RawProvider:
        provider = RawProvider(answering)
        provider.server = await asyncio.start_server(provider.handle, "127.0.0.1", 0)
        started.append(provider)
        return provider

    yield start
    for provider in started:
        assert provider.server is not None
        provider.server.close()
        for task, writer in provider.handlers:
            writer.close()
            task.cancel()  # one may wait for what never comes
        await asyncio.gather(*(task for task, _ in provider.handlers), return_exceptions=True)


def answering(data: bytes, keep: bool = True) -> Answering:
    async def answer(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(data)
        await writer.drain()
        return keep

    return answer


def first_then_ok(first: Answering) -> Answering:
    """The first request answered by `first`, every later one with OK (on the same connection)."""
    answered = 0

    async def answer(request: bytes, writer: asyncio.StreamWriter) -> bool:
        nonlocal answered
        answered += 1
        if answered > 1:
            writer.write(OK)
            return True
        return await first(request, writer)

    return answer


def one_answer_a_connection(answer: bytes) -> Answering:
    """As tinyproxy does: one answer a connection, no `Connection: close`, then the connection's
    close; a request sent on it before the close arrived gets no answer."""
    answered: set[int] = set()

    async def answer_once(request: bytes, writer: asyncio.StreamWriter) -> bool:
        if id(writer) in answered:
            return False  # the next request on the connection: closed unanswered
        answered.add(id(writer))
        writer.write(answer)
        await writer.drain()
        return True

    return answer_once


COMPLETION = (b'{"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "m", "choices": [{"index": 0, '
              b'"message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}], "usage": '
              b'{"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}')
CHUNKS = [b'data: {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": '
          b'[{"index": 0, "delta": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}\n\n',
          b"data: [DONE]\n\n"]


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


async def write_parts(writer: asyncio.StreamWriter, parts: list[bytes],
                      before_each: Callable[[], Awaitable[None]]) -> None:
    """A chunked answer written a part at a time, each once `before_each` returns, then its end."""
    writer.write(CHUNKED_HEAD)
    for part in parts:
        await before_each()
        writer.write(chunk(part))
        await writer.drain()
    writer.write(b"0\r\n\r\n")


async def exchange(pool: ProviderConnections, path: str = "chat/completions") -> tuple[int, bytes]:
    answer = await asyncio.wait_for(pool.post(path, JSON, b'{"model": "m"}', DEADLINE), DEADLINE)
    try:
        return answer.status, await asyncio.wait_for(answer.read(), DEADLINE)
    finally:
        answer.release()


async def test_a_kept_alive_connection_carries_the_next_request(raw_provider: Callable[..., Awaitable[RawProvider]]
                                                                ) -> None:
    provider = await raw_provider(answering(OK))
    pool = ProviderConnections(provider.url, 10)
    assert [await exchange(pool) for _ in range(3)] == [(200, b'{"a": true}')] * 3
    assert provider.connections == 1
    first = provider.requests[0]
    assert first.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"\r\nContent-Type: application/json\r\n" in first
    assert first.endswith(b"Content-Length: 14\r\n\r\n{\"model\": \"m\"}")
    await pool.close()


async def test_the_request_target_is_encoded(raw_provider: Callable[..., Awaitable[RawProvider]]) -> None:
    provider = await raw_provider(answering(OK))
    pool = ProviderConnections(provider.url, 10)
    await exchange(pool, "chat/completions?api-version=2024 10&x=é")
    assert provider.requests[0].startswith(b"POST /v1/chat/completions?api-version=2024+10&x=%C3%A9 HTTP/1.1")
    await pool.close()


async def test_credentials_in_the_url_are_basic_authentication_not_part_of_host(
        raw_provider: Callable[..., Awaitable[RawProvider]]) -> None:
    provider = await raw_provider(answering(OK))
    pool = ProviderConnections(provider.url.replace("http://", "http://user:p%40ss@"), 10)
    await exchange(pool)
    await asyncio.wait_for(pool.post("chat/completions", {"Authorization": "Bearer k"}, b"{}", DEADLINE),
                           DEADLINE)
    host = provider.url.split("/")[2]
    plain, bearer = provider.requests
    assert f"\r\nHost: {host}\r\n".encode() in plain
    assert b"\r\nAuthorization: Basic dXNlcjpwQHNz\r\n" in plain  # user:p@ss
    assert b"Authorization: Bearer k\r\n" in bearer
    assert b"Basic" not in bearer
    await pool.close()


async def test_an_answer_that_ends_with_its_connection_is_read_whole(
        raw_provider: Callable[..., Awaitable[RawProvider]]) -> None:
    provider = await raw_provider(answering(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{}", keep=False))
    pool = ProviderConnections(provider.url, 10)
    assert await exchange(pool) == (200, b"{}")
    assert await exchange(pool) == (200, b"{}")
    assert provider.connections == 2  # such a connection is not used again
    await pool.close()


async def test_informational_answers_are_passed_over(raw_provider: Callable[..., Awaitable[RawProvider]]) -> None:
    provider = await raw_provider(answering(b"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n" + OK))
    pool = ProviderConnections(provider.url, 10)
    assert await exchange(pool) == (200, b'{"a": true}')
    assert await exchange(pool) == (200, b'{"a": true}')
    await pool.close()


async def test_a_chunked_answer_arrives_in_its_parts(raw_provider: Callable[..., Awaitable[RawProvider]]) -> None:
    events = [b"data: {\"n\": %d}\n\n" % n for n in range(3)]
    chunked = b"".join(chunk(e) for e in events) + b"0\r\n\r\n"
    provider = await raw_provider(answering(CHUNKED_HEAD + chunked))
    pool = ProviderConnections(provider.url, 10)
    answer = await pool.post("chat/completions", JSON, b"{}", DEADLINE)
    assert answer.headers["content-type"] == "text/event-stream"
    assert b"".join([part async for part in answer.chunks(DEADLINE)]) == b"".join(events)
    answer.release()
    assert await exchange(pool) == (200, b"".join(events))  # the same connection, for the next one
    assert provider.connections == 1
    await pool.close()


async def test_a_slow_reader_holds_the_provider_back(raw_provider: Callable[..., Awaitable[RawProvider]]) -> None:
    """Past the pause mark the socket is not read, and it is read again as the reader catches up:
    every byte arrives, in order."""
    size = 3 * http1._PAUSE_AT
    body = bytes(range(256)) * (size // 256)
    provider = await raw_provider(answering(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + body))
    pool = ProviderConnections(provider.url, 10)
    answer = await pool.post("chat/completions", JSON, b"{}", DEADLINE)
    parts = answer.chunks(DEADLINE)
    received = [await anext(parts)]
    while answer._buffered <= http1._PAUSE_AT and not answer.complete:  # the provider writes on
        await asyncio.wait_for(answer._wait(), DEADLINE)  # woken by each part that arrives
    assert answer._connection._paused or answer.complete
    received += [part async for part in parts]
    assert b"".join(received) == body
    answer.release()
    await pool.close()


async def test_a_connection_paused_for_a_slow_reader_reads_again_for_the_next_answer(
        raw_provider: Callable[..., Awaitable[RawProvider]]) -> None:
    """An answer that arrives whole while its reader lags leaves the socket paused; the caller that
    stops reading then (its client hung up) gives the connection back, and the next answer on it
    must still be read."""
    almost, rest = b"a" * (http1._PAUSE_AT - 1000), b"b" * 10_000
    first_read, most_read = asyncio.Event(), asyncio.Event()

    async def answer(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(b"first"))
        await first_read.wait()
        writer.write(chunk(almost))
        await most_read.wait()
        writer.write(chunk(rest) + b"0\r\n\r\n")  # past the pause mark, and the end
        return True

    provider = await raw_provider(first_then_ok(answer))
    pool = ProviderConnections(provider.url, 1)
    slow = await pool.post("chat/completions", JSON, b"{}", DEADLINE)
    assert await anext(slow.chunks(DEADLINE)) == b"first"
    first_read.set()
    while slow._buffered < len(almost):
        await asyncio.wait_for(slow._wait(), DEADLINE)
    most_read.set()
    while not slow.complete:
        await asyncio.wait_for(slow._wait(), DEADLINE)
    assert slow._connection._paused
    slow.release()  # complete and kept alive: back to the pool
    assert await exchange(pool) == (200, b'{"a": true}')
    assert provider.connections == 1
    await pool.close()


async def test_a_stream_that_stalls_longer_than_its_bound_fails_with_a_timeout(
        raw_provider: Callable[..., Awaitable[RawProvider]]) -> None:
    """The first part comes, then nothing: the wait for the next fails once it has lasted the bound."""
    async def stall(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(CHUNKED_HEAD + chunk(b"first"))
        await asyncio.Event().wait()  # never more
        return True

    provider = await raw_provider(stall)
    pool = ProviderConnections(provider.url, 10)
    answer = await pool.post("chat/completions", JSON, b"{}", DEADLINE)
    parts = answer.chunks(0.2)
    assert await anext(parts) == b"first"
    loop = asyncio.get_running_loop()
    waited_from = loop.time()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(anext(parts), DEADLINE)
    assert 0.19 <= loop.time() - waited_from < DEADLINE / 2  # the bound's doing, not wait_for's
    answer.release()
    await pool.close()


async def test_waits_that_each_stay_under_the_stall_bound_are_no_stall(
        raw_provider: Callable[..., Awaitable[RawProvider]]) -> None:
    """Parts 0.1 s apart, read at once, for several times the 0.25 s bound: each wait is short, so
    the one timer, due while a later wait is under way, is set again for that wait's own deadline."""
    bound, gap, parts_sent = 0.25, 0.1, 8

    async def trickle(request: bytes, writer: asyncio.StreamWriter) -> bool:
        await write_parts(writer, [b"part %d;" % n for n in range(parts_sent)], lambda: asyncio.sleep(gap))
        return True

    provider = await raw_provider(trickle)
    pool = ProviderConnections(provider.url, 10)
    answer = await pool.post("chat/completions", JSON, b"{}", DEADLINE)
    loop = asyncio.get_running_loop()
    started = loop.time()
    received = [part async for part in answer.chunks(bound)]
    assert b"".join(received) == b"".join(b"part %d;" % n for n in range(parts_sent))
    assert loop.time() - started > 2 * bound  # the reads outlasted the bound, together
    answer.release()
    await pool.close()


async def test_the_time_a_reader_spends_between_waits_does_not_count_toward_the_stall_bound(
        raw_provider: Callable[..., Awaitable[RawProvider]]) -> None:
    """The reader takes longer than the bound over each part (a slow client), then asks for the
    next, which comes 0.05 s later: every wait is short, and the stream ends well, its connection
    kept for the next answer."""
    bound, parts_sent = 0.2, 3
    asked = asyncio.Queue[None]()

    async def on_demand(request: bytes, writer: asyncio.StreamWriter) -> bool:
        async def when_asked() -> None:
            await asyncio.wait_for(asked.get(), DEADLINE)
            await asyncio.sleep(0.05)

        await write_parts(writer, [b"part %d;" % n for n in range(parts_sent)], when_asked)
        return True

    provider = await raw_provider(first_then_ok(on_demand))
    pool = ProviderConnections(provider.url, 1)
    answer = await pool.post("chat/completions", JSON, b"{}", DEADLINE)
    parts = answer.chunks(bound)
    received = []
    for _ in range(parts_sent):
        asked.put_nowait(None)
        received.append(await asyncio.wait_for(anext(parts), DEADLINE))
        await asyncio.sleep(bound * 2)  # busy elsewhere: a timer due now finds no wait under way
    assert [part async for part in parts] == []
    assert received == [b"part %d;" % n for n in range(parts_sent)]
    answer.release()
    assert await exchange(pool) == (200, b'{"a": true}')
    assert provider.connections == 1
    await pool.close()


@pytest.mark.parametrize(("sent", "description"), [
    (b"SSH-2.0-OpenSSH_9.2\r\n", "its answer is not HTTP"),
    (b"", "the provider closed the connection"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"cut\": ", "its answer broke off"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n", "its answer broke off"),
], ids=["not_http", "hung_up", "cut_short", "chunks_cut_short"])
async def test_a_provider_that_breaks_the_rules_is_a_clear_error(
        raw_provider: Callable[..., Awaitable[RawProvider]], sent: bytes, description: str) -> None:
    provider = await raw_provider(answering(sent, keep=False))
    pool = ProviderConnections(provider.url, 1)
    with pytest.raises(ProviderConnectionError) as caught:
        await exchange(pool)
    assert caught.value.description == description
    upstream = Upstream(_session_unused(), provider.url, None, DEADLINE, DEADLINE, max_connections=1)
    with pytest.raises(UpstreamUnavailable, match=f"could not reach the provider: {description}"):
        await upstream.post("chat/completions", {"model": "m"}, {})
    await upstream.aclose()
    await pool.close()


async def test_a_provider_that_does_not_take_the_connection_in_time_is_a_timeout() -> None:
    """A listening socket whose backlog is full drops the connection's SYN: the connect timeout
    runs out, and that is a 504 (a timeout), not a 502 (an unreachable provider)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(3):  # the backlog's one place and more, never accepted
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    upstream = Upstream(_session_unused(), f"http://127.0.0.1:{port}/v1", None, DEADLINE, 0.3, max_connections=1)
    try:
        with pytest.raises(UpstreamTimeout):
            await upstream.post("chat/completions", {"model": "m"}, {})
    finally:
        await upstream.aclose()
        for filler in fillers:
            filler.close()
        listener.close()


async def test_an_error_answer_that_breaks_off_says_what_the_provider_answered(
        raw_provider: Callable[..., Awaitable[RawProvider]]) -> None:
    provider = await raw_provider(answering(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 100\r\n\r\n{\"err",
                                            keep=False))
    upstream = Upstream(_session_unused(), provider.url, None, DEADLINE, DEADLINE, max_connections=1)
    with pytest.raises(UpstreamUnavailable, match=r"^the provider answered 500 and then broke off$"):
        await upstream.post("chat/completions", {"model": "m"}, {})
    await upstream.aclose()


async def test_a_connection_the_provider_closed_while_idle_is_not_used(
        raw_provider: Callable[..., Awaitable[RawProvider]]) -> None:
    hang_up = asyncio.Event()

    async def answer_then_hang_up_when_told(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(OK)
        await writer.drain()
        if len([r for r in provider.requests]) == 1:
            await hang_up.wait()
            return False
        return True

    provider = await raw_provider(answer_then_hang_up_when_told)
    pool = ProviderConnections(provider.url, 10)
    assert await exchange(pool) == (200, b'{"a": true}')
    [idle] = pool._idle
    hang_up.set()
    for _ in range(1000):  # the end of the connection reaches the client in a few turns of the loop
        if not idle.open:
            break
        await asyncio.sleep(0)
    assert not idle.open
    assert await exchange(pool) == (200, b'{"a": true}')
    assert provider.connections == 2
    await pool.close()


async def test_a_kept_connection_closed_as_the_request_went_out_is_tried_once_more_on_a_new_one(
        raw_provider: Callable[..., Awaitable[RawProvider]]) -> None:
    provider = await raw_provider(one_answer_a_connection(OK))
    pool = ProviderConnections(provider.url, 10)
    assert [await exchange(pool) for _ in range(3)] == [(200, b'{"a": true}')] * 3
    assert provider.connections == 3
    assert len(provider.requests) == 5  # the second and third went out twice: once unanswered
    await pool.close()


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_a_request_sent_again_on_a_new_connection_says_so_on_its_chat_span(
        raw_provider: Callable[..., Awaitable[RawProvider]], make_gateway: GatewayFactory, stream: bool) -> None:
    """The transport's resend is the HTTP conventions' http.request.resend_count on the chat span;
    a request sent once has none."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(COMPLETION)
    answer = CHUNKED_HEAD + b"".join(chunk(part) for part in CHUNKS) + b"0\r\n\r\n" if stream else head + COMPLETION
    provider = await raw_provider(one_answer_a_connection(answer))
    gateway = await make_gateway(Settings(port=0, upstream=provider.url, trajectory_store=False))
    for _ in range(2):
        if stream:
            chunks = [c async for c in await gateway.client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hello"}], stream=True)]
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "hi"
        else:
            completion = await gateway.client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hello"}])
            assert completion.choices[0].message.content == "hi"
    assert (provider.connections, len(provider.requests)) == (2, 3)  # the second went out twice
    chats = sorted((s for s in gateway.spans() if s.name.startswith(names.SPAN_CHAT_PREFIX)),
                   key=lambda span: span.start_time or 0)
    assert [(s.attributes or {}).get(names.ATTR_HTTP_RESEND_COUNT) for s in chats] == [None, 1]


def test_the_resend_count_is_the_conventions_attribute() -> None:
    assert names.ATTR_HTTP_RESEND_COUNT == http_attributes.HTTP_REQUEST_RESEND_COUNT


async def test_a_new_connection_closed_unanswered_is_an_error_not_a_retry(
        raw_provider: Callable[..., Awaitable[RawProvider]]) -> None:
    async def never_answer(request: bytes, writer: asyncio.StreamWriter) -> bool:
        return False

    provider = await raw_provider(never_answer)
    pool = ProviderConnections(provider.url, 10)
    with pytest.raises(ProviderConnectionError, match="the provider closed the connection"):
        await exchange(pool)
    assert provider.connections == 1
    await pool.close()


async def test_a_connection_idle_too_long_is_not_trusted(raw_provider: Callable[..., Awaitable[RawProvider]],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    provider = await raw_provider(answering(OK))
    pool = ProviderConnections(provider.url, 10)
    await exchange(pool)
    now = connections.time.monotonic()
    monkeypatch.setattr(connections.time, "monotonic", lambda: now + connections.IDLE_SECONDS + 1)
    await exchange(pool)
    assert provider.connections == 2
    await pool.close()


async def test_connections_left_idle_after_a_burst_are_closed(raw_provider: Callable[..., Awaitable[RawProvider]]
                                                              ) -> None:
    """A burst opens a connection per concurrent call; once idle for the pool's idle time, each is
    closed by the gateway (the provider sees its end) without any further call to notice it."""
    burst = 20
    all_in = asyncio.Event()

    async def answer_once_all_came(request: bytes, writer: asyncio.StreamWriter) -> bool:
        if len(provider.requests) == burst:
            all_in.set()
        await all_in.wait()
        writer.write(OK)
        return True

    provider = await raw_provider(answer_once_all_came)
    pool = ProviderConnections(provider.url, burst, idle_seconds=0.2)
    assert await asyncio.gather(*(exchange(pool) for _ in range(burst))) == [(200, b'{"a": true}')] * burst
    assert provider.connections == burst
    # Each of the provider's handlers ends when its connection is closed from the gateway's side.
    await asyncio.wait_for(asyncio.gather(*(task for task, _ in provider.handlers)), DEADLINE)
    assert pool._open == set()
    assert await exchange(pool) == (200, b'{"a": true}')  # and the pool still serves, on a new one
    assert provider.connections == burst + 1
    await pool.close()


async def test_a_call_given_up_frees_its_connection(raw_provider: Callable[..., Awaitable[RawProvider]]) -> None:
    """A caller that stops waiting (its timeout, its client gone): the connection, whose answer may
    still come, is closed, and its place in the pool is free."""
    never = asyncio.Event()

    async def answer_the_second_only(request: bytes, writer: asyncio.StreamWriter) -> bool:
        if provider.connections == 1:
            await never.wait()
        writer.write(OK)
        return True

    provider = await raw_provider(answer_the_second_only)
    pool = ProviderConnections(provider.url, 1)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(pool.post("chat/completions", JSON, b"{}", DEADLINE), 0.2)
    assert await exchange(pool) == (200, b'{"a": true}')
    assert provider.connections == 2
    await pool.close()


async def test_a_line_break_in_a_header_is_refused_before_anything_is_sent(
        raw_provider: Callable[..., Awaitable[RawProvider]]) -> None:
    provider = await raw_provider(answering(OK))
    pool = ProviderConnections(provider.url, 1)
    with pytest.raises(ValueError, match="line break"):
        await pool.post("chat/completions", {"X-Note": "a\r\nX-Injected: 1"}, b"{}", DEADLINE)
    assert provider.requests == []
    assert await exchange(pool) == (200, b'{"a": true}')  # its place in the pool was not lost
    await pool.close()


def test_an_api_key_with_a_line_break_fails_at_start_up() -> None:
    with pytest.raises(ValueError, match="line break"):
        Upstream(_session_unused(), "http://127.0.0.1:1/v1", SecretStr("sk-a\nX-Injected: 1"), 1, 1)


def test_a_base_url_that_is_not_http_fails_at_start_up() -> None:
    with pytest.raises(ValueError, match="http"):
        ProviderConnections("ftp://files.example/v1", 1)


# --- TLS ---------------------------------------------------------------------------------------------


@pytest.fixture
async def tls_provider(aiohttp_server: AiohttpServer, tmp_path_factory: pytest.TempPathFactory,
                       monkeypatch: pytest.MonkeyPatch) -> tuple[str, trustme.CA]:
    """An https provider whose certificate a CA of the test's own signed; that CA is the one
    trusted (SSL_CERT_FILE, which ssl's default context reads)."""
    ca = trustme.CA()
    certificate = ca.issue_cert("127.0.0.1", "localhost")
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    certificate.configure_cert(server_context)

    async def completion(request: web.Request) -> web.Response:
        return web.json_response({"id": "chatcmpl-1", "seen": await request.json()})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completion)
    server = await aiohttp_server(app, ssl=server_context)
    trusted = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(trusted))
    monkeypatch.setenv("SSL_CERT_FILE", str(trusted))
    return f"https://127.0.0.1:{server.port}/v1", ca


async def test_a_provider_over_tls(tls_provider: tuple[str, trustme.CA]) -> None:
    url, _ = tls_provider
    pool = ProviderConnections(url, 2)
    status, body = await exchange(pool)
    assert (status, body) == (200, b'{"id": "chatcmpl-1", "seen": {"model": "m"}}')
    await pool.close()


async def test_a_certificate_no_trusted_authority_signed_is_refused(tls_provider: tuple[str, trustme.CA],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    url, _ = tls_provider
    monkeypatch.delenv("SSL_CERT_FILE")
    pool = ProviderConnections(url, 2)
    verify_failed = r"cannot connect \(TLS: CERTIFICATE_VERIFY_FAILED: .*upstream_ca_bundle"
    with pytest.raises(ProviderConnectionError, match=verify_failed):
        await exchange(pool)
    await pool.close()


def _session_unused() -> object:
    """Upstream's aiohttp session, which these calls never touch."""
    return object()
