"""One HTTP/1.1 connection to the provider, an asyncio protocol whose answers httptools (llhttp,
the parser Node.js uses) parses as they arrive, and the Answer it reads: status, headers, and the
body whole or part by part, with the socket paused while a slow reader lags. The pool that owns
the connections is gateway.provider.connections."""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import cast

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.provider.route import ProviderConnectionError, closed_before_answering, describe_error

_PAUSE_AT = 256 * 1024  # bytes of an answer waiting to be read: past this, stop reading from the socket


class Answer:
    """The provider's answer to one request: its status and headers once they came, its body as it
    arrives. `release` it when done: its connection goes back to the pool when the answer was read
    to its end, and is closed otherwise."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self.status = 0
        self.headers: CIMultiDictProxy[str] = _NO_HEADERS
        self.complete = False
        self._parts: deque[bytes] = deque()
        self._buffered = 0
        self._error: BaseException | None = None
        self._woken: asyncio.Future[None] | None = None  # what a reader waits on
        self._keep_alive = False
        self._framed = True  # its end is marked (length or chunks) rather than the connection's close
        self.began = False  # a byte of it came
        self._streamed = False  # read as it arrives (chunks), rather than whole (read): may pause the socket
        self._deadline: float | None = None  # of the reader's wait for the next part, while it waits
        self._stall_timer: asyncio.TimerHandle | None = None  # the one timer that bounds those waits

    async def head(self) -> None:
        """Waits for the status and headers."""
        while not self.status and self._error is None:
            await self._wait()
        if self._error is not None and not self.status:
            raise self._error

    async def read(self) -> bytes:
        """The whole body."""
        while not self.complete:
            self._raise_if_failed()
            await self._wait()
        body = b"".join(self._parts)
        self._parts.clear()
        return body

    async def chunks(self, stall_seconds: float) -> AsyncIterator[bytes]:
        """The body's parts as they arrive. Each wait for the next part lasts at most
        `stall_seconds`, then fails with TimeoutError (the provider stalled); the time the caller
        spends between parts does not count. The socket is not read while more than _PAUSE_AT bytes
        wait here, so a slow reader holds the provider back rather than the gateway's memory growing.

        One timer of the loop's bounds every wait of the answer (`_stalled`), rather than a timer
        armed and cancelled around each read (asyncio.timeout), which a streamed request reads
        many times: it costs less CPU and fewer instructions (docs/benchmarks.md)."""
        self._streamed = True
        loop = asyncio.get_running_loop()
        while True:
            if self._parts:
                part = self._parts.popleft()
                self._take(len(part))
                yield part
            elif self.complete:
                return
            else:
                self._raise_if_failed()
                self._deadline = loop.time() + stall_seconds
                if self._stall_timer is None:
                    self._stall_timer = loop.call_at(self._deadline, self._stalled)
                try:
                    await self._wait()
                finally:
                    self._deadline = None

    def release(self) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        self._connection.done(self, reusable=self.complete and self._keep_alive and self._error is None)

    def _stalled(self) -> None:
        """The stall timer is due: a wait past its deadline fails the answer; a wait begun since
        the timer was armed gets it again, for its own deadline; with no wait under way it lapses,
        and the next wait arms it. Within a millisecond of the deadline counts as past it (the
        loop's timers may fire that early)."""
        self._stall_timer = None
        if self._deadline is None:
            return
        loop = asyncio.get_running_loop()
        if loop.time() + 0.001 < self._deadline:
            self._stall_timer = loop.call_at(self._deadline, self._stalled)
        else:
            self._failed(TimeoutError())

    # --- fed by the connection --------------------------------------------------------------------

    def _started(self, status: int, headers: CIMultiDictProxy[str], keep_alive: bool, framed: bool) -> None:
        self.status, self.headers, self._keep_alive, self._framed = status, headers, keep_alive, framed
        self._wake()

    def _body(self, part: bytes) -> None:
        self._parts.append(part)
        self._buffered += len(part)
        if self._streamed and self._buffered > _PAUSE_AT:
            self._connection.pause()
        self._wake()

    def _finished(self) -> None:
        self.complete = True
        self._wake()

    def _failed(self, error: BaseException) -> None:
        if not self.complete:
            self._error = error
            self._wake()

    def _closed(self, exc: Exception | None) -> None:
        """The connection closed: the end of an answer that ends so, else a broken one (a TLS
        alert, such as a provider's refusal of the client certificate, says why)."""
        if self.status and not self._framed:
            self._finished()
        elif isinstance(exc, ssl.SSLError):
            self._failed(describe_error(exc))
        elif not self.status:
            self._failed(closed_before_answering(self._connection.tls))
        else:
            self._failed(ProviderConnectionError("its answer broke off"))

    # --- waiting ----------------------------------------------------------------------------------

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _take(self, size: int) -> None:
        self._buffered -= size
        if self._buffered <= _PAUSE_AT // 2:
            self._connection.resume()

    async def _wait(self) -> None:
        self._woken = asyncio.get_running_loop().create_future()
        try:
            await self._woken
        finally:
            self._woken = None

    def _wake(self) -> None:
        if self._woken is not None and not self._woken.done():
            self._woken.set_result(None)


_NO_HEADERS: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())


class Connection(asyncio.Protocol):
    """One connection to the provider: an answer at a time, parsed as it arrives."""

    def __init__(self, returned: Callable[[Connection, bool], None]) -> None:
        self._returned = returned  # told when an answer is done with, and whether the connection is reusable
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._answer: Answer | None = None
        self._headers: list[tuple[str, str]] = []
        self._informational = False  # a 1xx answer ahead of the real one
        self._paused = False
        self.open = True
        self.idle_since = 0.0

    @property
    def tls(self) -> bool:
        return self._transport is not None and self._transport.get_extra_info("sslcontext") is not None

    def send(self, data: bytes) -> Answer:
        assert self._transport is not None, "sent on a connection not yet made"
        assert self._answer is None, "sent on a connection that has an answer under way"
        self._answer = answer = Answer(self)
        self._transport.write(data)
        return answer

    def done(self, answer: Answer, reusable: bool) -> None:
        if answer is not self._answer:
            return  # released twice
        self._answer = None
        if not reusable:
            self.close()
        else:
            self.resume()  # an answer that came whole to a lagging reader may have paused reading
        self._returned(self, reusable and self.open)

    def close(self) -> None:
        self.open = False
        if self._transport is not None:
            self._transport.abort()

    def pause(self) -> None:
        if not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()

    # --- asyncio --------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is one, without the class

    def data_received(self, data: bytes) -> None:
        if self._answer is None:  # nothing was asked: a server that talks out of turn is not reused
            self.close()
            return
        self._answer.began = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            self._answer._failed(ProviderConnectionError("its answer is not HTTP"))
            self.close()

    def eof_received(self) -> bool:
        self.open = False  # not reused from now on; connection_lost follows
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if self._answer is not None:
            self._answer._closed(exc)

    # --- httptools --------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._headers = []

    def on_header(self, name: bytes, value: bytes) -> None:
        # As aiohttp decodes them: bytes that are not UTF-8 survive the round trip.
        self._headers.append((name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape")))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        self._informational = 100 <= status < 200
        if self._informational or self._answer is None:
            return
        headers = CIMultiDictProxy(CIMultiDict(self._headers))
        framed = "Content-Length" in headers or "chunked" in headers.get("Transfer-Encoding", "").lower()
        self._answer._started(status, headers, self._parser.should_keep_alive(), framed)

    def on_body(self, body: bytes) -> None:
        if self._answer is not None and not self._informational:
            self._answer._body(body)

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
        elif self._answer is not None:
            self._answer._finished()
