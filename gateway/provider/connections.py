"""The gateway's HTTP/1.1 connections to its provider, for the engine's calls (a JSON request, its
answer whole or as it streams): a bounded pool of keep-alive connections to the one origin of the
provider's base URL, one request at a time on each, answers parsed by httptools (llhttp, the
parser Node.js uses).

Every other request to the provider (a pass-through, a readiness probe) goes through aiohttp's
client. This one does much less per call: no URL object, no header multidict to send, no
request and response objects with their tracing hooks, no timer handles of their own (the
caller's asyncio.timeout bounds the call; a stream's waits for its parts, one timer of the answer's:
Answer.chunks). Per provider call, a client process at concurrency 10
against the built-in fast upstream spent 147-153 us of CPU with aiohttp's ClientSession (the
gateway's timeouts and headers) against 49-60 us with a connection of this kind, on this machine.

Its connections take the route gateway.provider.route gives: direct, through an HTTP proxy
(absolute-form requests for an http:// provider, a CONNECT tunnel then TLS for https://), with
the transport's TLS settings.

What it does not do, since the engine's provider calls need none of it: redirects (never
followed, see upstream._raise_for_status), decompression (the gateway asks for identity),
cookies, HTTP/2.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import cast

import httptools
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from gateway.provider.route import (
    ProviderConnectionError,
    ProviderRoute,
    closed_before_answering,
    describe_error,
    provider_route,
)

__all__ = ["IDLE_SECONDS", "Answer", "ProviderConnectionError", "ProviderConnections"]

IDLE_SECONDS = 15.0  # the default of upstream_idle_seconds: an idle connection is closed after this long
# (one its server closed sooner is seen closed and not used; providers keep theirs a minute or more)
_PAUSE_AT = 256 * 1024  # bytes of an answer waiting to be read: past this, stop reading from the socket


class Answer:
    """The provider's answer to one request: its status and headers once they came, its body as it
    arrives. `release` it when done: its connection goes back to the pool when the answer was read
    to its end, and is closed otherwise."""

    def __init__(self, connection: _Connection) -> None:
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
        armed and cancelled around each read (asyncio.timeout, 11 us a read on uvloop). A streamed
        request of toolspan's then cost 0.95 (Chat) and 0.93 (Responses) of its CPU before, medians
        of ten rounds (`python bench/proxy.py --scenarios stream,responses-stream --rounds 10
        --seconds 1 --targets floor,toolspan --compare DIR`), and 2,032 against 2,214 and 2,998
        against 3,354 thousand instructions (`python bench/instructions.py --scenarios
        stream,responses-stream --targets toolspan`, each checkout)."""
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


class _Connection(asyncio.Protocol):
    """One connection to the provider: an answer at a time, parsed as it arrives."""

    def __init__(self, pool: ProviderConnections) -> None:
        self._pool = pool
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
        self._pool.returned(self, reusable and self.open)

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


class ProviderConnections:
    """A pool of at most `limit` connections to the origin of `base_url` (http or https). A
    connection idle for `idle_seconds` is closed: after a burst, the descriptors it took are given
    back rather than held until the provider hangs up (if it ever does)."""

    def __init__(self, base_url: str, limit: int, idle_seconds: float = IDLE_SECONDS,
                 route: ProviderRoute | None = None) -> None:
        self._route = route or provider_route(base_url, "direct", None, None, None, {})
        url = URL(base_url)
        self._base_path = url.raw_path.rstrip("/")
        self._host_line = f"Host: {url.host_port_subcomponent}\r\n"  # credentials never in Host
        self._proxy_head = self._route.proxy_head()  # a forwarding proxy's credentials, on every request
        # Credentials in the URL are sent as HTTP Basic authentication, as aiohttp's client sends
        # them, unless the call carries an Authorization header of its own.
        credentials = base64.b64encode(f"{url.user}:{url.password or ''}".encode()).decode()
        self._basic_auth = f"Authorization: Basic {credentials}\r\n" if url.user is not None else None
        self._slots = asyncio.Semaphore(limit)
        self._idle: list[_Connection] = []  # oldest first: returned ones go at the end, reused from there
        self._idle_seconds = idle_seconds
        # One timer for the whole pool, due when its oldest idle connection expires (rather than a
        # timer per connection, set and cancelled on every call).
        self._reaper: asyncio.TimerHandle | None = None
        self._open: set[_Connection] = set()
        self._targets: dict[str, str] = {}  # a path and query as given -> as sent (percent-encoded)

    def target(self, path_qs: str) -> str:
        """The request target of `path_qs` (under the base URL's path), encoded as a URL must be,
        in absolute form for a forwarding proxy; that of the few paths a gateway calls is kept."""
        found = self._targets.get(path_qs)
        if found is None:
            url = URL(f"{self._base_path}/{path_qs.lstrip('/')}")
            found = self._route.request_target(url.raw_path_qs)
            if len(self._targets) < 1024:  # a caller's query string can be anything: keep the memory bounded
                self._targets[path_qs] = found
        return found

    async def post(self, path_qs: str, headers: Mapping[str, str], body: bytes, connect_timeout: float,
                   resent: Callable[[], None] | None = None) -> Answer:
        """Sends the request on a free connection (a new one when none is idle: connecting takes at
        most `connect_timeout`) and waits for the answer's head. The caller bounds the whole call,
        the wait for a free connection included, and releases the answer. `resent` is called when
        the request goes out a second time (below)."""
        head = [f"POST {self.target(path_qs)} HTTP/1.1\r\n", self._host_line, self._proxy_head]
        for name, value in headers.items():
            if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
                raise ValueError(f"the header {name!r} holds a line break")
            head.append(f"{name}: {value}\r\n")
        if self._basic_auth is not None and not any(name.lower() == "authorization" for name in headers):
            head.append(self._basic_auth)
        head.append(f"Content-Length: {len(body)}\r\n\r\n")
        data = "".join(head).encode("utf-8", "surrogateescape") + body
        answer = await self._send(data, connect_timeout, reuse=True)
        if answer is None:
            # The idle connection it went out on had been closed by the provider, or by a proxy
            # that keeps no connection past one answer (tinyproxy), as the request left: nothing
            # of an answer came, so once more on a new connection.
            if resent is not None:
                resent()
            answer = await self._send(data, connect_timeout, reuse=False)
        assert answer is not None
        return answer

    async def _send(self, data: bytes, connect_timeout: float, reuse: bool) -> Answer | None:
        """The answer's head to `data`, sent on an idle connection when `reuse` and one is there;
        None when that idle connection closed before any byte of an answer came."""
        await self._slots.acquire()
        try:
            idle = self._idle_connection() if reuse else None
            connection = idle or await self._connect(connect_timeout)
        except BaseException:
            self._slots.release()
            raise
        answer = connection.send(data)
        try:
            await answer.head()
        except ProviderConnectionError:
            answer.release()
            if idle is not None and not answer.began:
                return None
            raise
        except BaseException:
            answer.release()
            raise
        if (refusal := self._route.refusal(answer.status)) is not None:
            answer.release()
            raise refusal
        return answer

    def returned(self, connection: _Connection, reusable: bool) -> None:
        """A connection's answer is done with: it waits for the next request, or is gone."""
        if reusable:
            connection.idle_since = time.monotonic()
            self._idle.append(connection)
            if self._reaper is None:
                self._reap_later()
        else:
            self._open.discard(connection)
        self._slots.release()

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        for connection in list(self._open):
            connection.close()
        self._open.clear()
        self._idle.clear()

    def _idle_connection(self) -> _Connection | None:
        """The most recently used idle connection that is still open and not too old to trust."""
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if connection.open and now - connection.idle_since < self._idle_seconds:
                return connection
            connection.close()
            self._open.discard(connection)
        return None

    def _reap_later(self) -> None:
        """Schedules the closing of the oldest idle connection when it expires."""
        if self._idle:
            due = self._idle[0].idle_since + self._idle_seconds - time.monotonic()
            self._reaper = asyncio.get_running_loop().call_later(max(due, 0.0), self._reap)

    def _reap(self) -> None:
        """Closes the idle connections that expired (a prefix of the list, which is oldest first)."""
        self._reaper = None
        now = time.monotonic()
        expired = 0
        for connection in self._idle:
            if now - connection.idle_since < self._idle_seconds:
                break
            connection.close()
            self._open.discard(connection)
            expired += 1
        del self._idle[:expired]
        self._reap_later()

    async def probe(self, within: float) -> int:
        """The status of a HEAD of the base URL on a new connection of the pool's route (through
        its proxy, with its TLS), all within `within` seconds: what a readiness probe asks. It
        carries no credentials of the caller's nor of the gateway's."""
        head = f"HEAD {self.target('')} HTTP/1.1\r\n{self._host_line}{self._proxy_head}Connection: close\r\n\r\n"
        async with asyncio.timeout(within):
            answer = await self._send(head.encode("utf-8", "surrogateescape"), within, reuse=False)
        assert answer is not None  # a new connection's failure is raised
        answer.release()  # not read: HEAD has no body, which the parser is not told; so closed
        return answer.status

    async def _connect(self, within: float) -> _Connection:
        # A timeout is a gateway.provider.route.ConnectTimeout (a TimeoutError), an OSError a
        # ProviderConnectionError worded by gateway.provider.route.
        connection = await self._route.open(lambda: _Connection(self), within)
        self._open.add(connection)
        return connection
