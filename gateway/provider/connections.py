"""The gateway's HTTP/1.1 connections to its provider, for the engine's calls (a JSON request, its
answer whole or as it streams): a bounded pool of keep-alive connections to the one origin of the
provider's base URL, one request at a time on each (each connection and the answer it reads:
gateway.provider.http1).

Every other request to the provider (a pass-through, a readiness probe) goes through aiohttp's
client. This one does much less per call: no URL object, no header multidict to send, no
request and response objects with their tracing hooks, no timer handles of their own (the
caller's asyncio.timeout bounds the call; a stream's waits for its parts, one timer of the answer's:
Answer.chunks). A provider call on it costs a fraction of the CPU of one through aiohttp's
ClientSession (docs/benchmarks.md has the figures).

Its connections take the route gateway.provider.route gives: direct, through an HTTP proxy
(absolute-form requests for an http:// provider, a CONNECT tunnel then TLS for https://), with
the transport's TLS settings.

What it does not do, since the engine's provider calls need none of it: redirects (never
followed, see gateway.provider.errors.raise_for_status), decompression (the gateway asks for
identity), cookies, HTTP/2.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable, Mapping

from yarl import URL

from gateway.provider.http1 import Answer, Connection
from gateway.provider.route import ProviderConnectionError, ProviderRoute, provider_route

__all__ = ["IDLE_SECONDS", "Answer", "ProviderConnectionError", "ProviderConnections"]

IDLE_SECONDS = 15.0  # the default of upstream_idle_seconds: an idle connection is closed after this long
# (one its server closed sooner is seen closed and not used; providers keep theirs a minute or more)


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
        self._idle: list[Connection] = []  # oldest first: returned ones go at the end, reused from there
        self._idle_seconds = idle_seconds
        # One timer for the whole pool, due when its oldest idle connection expires (rather than a
        # timer per connection, set and cancelled on every call).
        self._reaper: asyncio.TimerHandle | None = None
        self._open: set[Connection] = set()
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

    def returned(self, connection: Connection, reusable: bool) -> None:
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

    def _idle_connection(self) -> Connection | None:
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

    async def _connect(self, within: float) -> Connection:
        # A timeout is a gateway.provider.route.ConnectTimeout (a TimeoutError), an OSError a
        # ProviderConnectionError worded by gateway.provider.route.
        connection = await self._route.open(lambda: Connection(self.returned), within)
        self._open.add(connection)
        return connection
