"""One MCP server as a source of tools: connect, list its tools into the registry, keep them current
on `notifications/tools/list_changed`, call them, and reconnect with backoff when the server goes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, Literal, cast

import anyio
import httpx2
import mcp_types
from mcp import Client
from mcp.client import Transport
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from gateway.mcp.http_limits import capped_json_bodies
from gateway.mcp.listing import BuiltTools, ListingWarnings, screened_message
from gateway.mcp.stdio import StdioServer, stdio_transport
from gateway.mcp.tools import METHOD_CALL_TOOL, build_tool, tool_result
from gateway.settings.parts import MCP_MAX_MESSAGE_BYTES, McpServer
from gateway.tools import Tool, ToolHooks, ToolRegistry, ToolResult
from gateway.tools.results import ToolOrigin

log = logging.getLogger("toolspan.mcp")
State = Literal["connecting", "up", "down"]
UNAVAILABLE = "mcp_server_unavailable"  # the error type of a call its server could not take
_LIST_PAGES = 100  # a server whose tools/list never ends cannot hold the connection up


class McpConnection:
    """The connection to one configured MCP server, kept by `run()` (a task of its own).

    Its tools stay registered while the server is down, so that calling one says the server is
    unavailable rather than that no such tool exists; they are listed afresh on reconnecting."""

    def __init__(self, name: str, config: McpServer, registry: ToolRegistry, hooks: ToolHooks,
                 client_info: mcp_types.Implementation, max_message_bytes: int = MCP_MAX_MESSAGE_BYTES,
                 on_request: bool = False) -> None:
        self.name = name
        self.config = config
        self.on_request = on_request  # its tools are offered only to the requests that declare it
        self.max_message_bytes = max_message_bytes
        self.state: State = "connecting"
        self.error: str | None = None  # why it is not up, when it is not
        self.protocol_version: str | None = None
        self.tools: tuple[str, ...] = ()  # the registered names of its tools
        self.disconnects = 0
        self._registry = registry
        self._hooks = hooks
        self._client_info = client_info
        self._client: Client | None = None
        self._wake = asyncio.Event()  # the session loop has something to do
        self._lost: str | None = None  # why the connection is gone, once it is
        self._relist = False  # the server announced a change of its tools not listed yet
        self._listed_at = 0.0  # when its tools were last listed (time.monotonic)
        self._warnings = ListingWarnings(name)
        self._built = BuiltTools(self._build_tool, self._warnings)
        self._changed = asyncio.Event()
        self._up_since = 0.0  # when the connection last came up (time.monotonic)

    @property
    def source(self) -> str:
        """Its name as a source of the registry's tools."""
        return f"mcp:{self.name}"

    @property
    def transport_name(self) -> str:
        """network.transport, as the MCP semantic conventions name it."""
        return "pipe" if self.config.command is not None else "tcp"

    async def wait_until(self, check: Callable[[McpConnection], bool]) -> None:
        """Return once `check(self)` holds; it is tried again at every change of state or tools."""
        while True:
            changed = self._changed
            if check(self):
                return
            await changed.wait()

    def _announce(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # --- the connection's life ------------------------------------------------------------------

    async def run(self) -> None:
        """Connect, serve, and reconnect after a failure, waiting twice as long after each failed
        attempt (from `reconnect_min_seconds` up to `reconnect_max_seconds`), until cancelled."""
        delay = self.config.reconnect_min_seconds
        while True:
            try:
                await self._session()
            except Exception as exc:  # every way a server can fail: refused, died, spoke nonsense
                self._lost = self._lost or _reason(exc)
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    # A stop that came during a failing connect: the transport's task group raised the
                    # connection error and dropped the cancellation, which must not be lost here.
                    raise asyncio.CancelledError from exc
            disconnected = self.state == "up"
            if disconnected:
                self.disconnects += 1
                # Back to the shortest wait only after a connection that held: one that fails as soon
                # as it is up (a server that crashes on its first call) keeps backing off.
                if time.monotonic() - self._up_since >= self.config.reconnect_max_seconds:
                    delay = self.config.reconnect_min_seconds
            self._hooks.mcp_server_state(self.name, False, disconnected)
            self._client = None
            self.state, self.error = "down", self._lost or "the connection ended"
            log.warning("MCP server %r is unavailable (%s); reconnecting in %.1f s", self.name, self.error, delay)
            self._announce()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.config.reconnect_max_seconds)

    async def _session(self) -> None:
        """One connection, from connecting to its loss."""
        self._lost, self._relist = None, False
        async with AsyncExitStack() as stack:
            transport = await self._transport(stack)
            client = Client(_watched(transport, self._lose, self._screened), message_handler=self._on_message,
                            client_info=self._client_info, cache=None)
            async with asyncio.timeout(self.config.connect_timeout_seconds):
                await stack.enter_async_context(client)
                self.protocol_version = client.protocol_version
                await self._list_tools(client)
                capabilities = client.server_capabilities.tools
                if self.protocol_version in MODERN_PROTOCOL_VERSIONS and capabilities and capabilities.list_changed:
                    # Since 2026-07-28 a server sends change notifications only on a listen stream.
                    await stack.enter_async_context(client.listen(tools_list_changed=True))
            self._client = client
            self.state, self.error, self._up_since = "up", None, time.monotonic()
            self._hooks.mcp_server_state(self.name, True, False)
            log.info("MCP server %r is up: %d tools", self.name, len(self.tools))
            self._announce()
            await self._serve(client)

    async def _serve(self, client: Client) -> None:
        """Ping it when due (the versions that have ping), and list its tools again after it
        announces a change: one listing at a time, and none sooner than `relist_min_seconds` after
        the last, so that announcements coming faster than that are answered by one listing.
        Returns when the connection is lost."""
        ping_every = self.config.ping_interval_seconds or None
        if self.protocol_version in MODERN_PROTOCOL_VERSIONS:
            ping_every = None  # gone from the protocol since 2026-07-28: such a server answers "Method not found"
        next_ping = None if ping_every is None else time.monotonic() + ping_every
        while self._lost is None:
            now = time.monotonic()
            relist_at = self._listed_at + self.config.relist_min_seconds if self._relist else None
            if relist_at is not None and now >= relist_at:
                self._relist = False
                async with asyncio.timeout(self.config.connect_timeout_seconds):
                    await self._list_tools(client)
                self._announce()
            elif next_ping is not None and ping_every is not None and now >= next_ping:
                async with asyncio.timeout(self.config.connect_timeout_seconds):
                    await client.send_ping()
                next_ping = time.monotonic() + ping_every
            else:
                due = [at for at in (relist_at, next_ping) if at is not None]
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(due) - now if due else None):
                        await self._wake.wait()
                self._wake.clear()

    async def _transport(self, stack: AsyncExitStack) -> Transport:
        config = self.config
        if config.command is not None:
            env = {key: value.get_secret_value() for key, value in config.env.items()}
            if sys.platform == "win32":  # no process groups to stop, nor POSIX signals: the SDK's own transport
                return stdio_client(StdioServerParameters(command=config.command, args=config.args,
                                                          env=env or None, cwd=config.cwd))
            return stdio_transport(StdioServer(self.name, config.command, config.args, env, config.cwd,
                                               self.max_message_bytes))
        assert config.url is not None  # the settings require a command or a URL
        headers = {key: value.get_secret_value() for key, value in config.headers.items()}
        if config.transport == "sse":
            return sse_client(config.url, headers=headers, timeout=config.connect_timeout_seconds)
        # Responses may stream for as long as a tool runs: only connecting is limited here.
        timeout = httpx2.Timeout(config.connect_timeout_seconds, read=None)
        hooks = {"response": [capped_json_bodies(self.max_message_bytes, self.name)]}
        http = await stack.enter_async_context(httpx2.AsyncClient(headers=headers, timeout=timeout, event_hooks=hooks))
        return streamable_http_client(config.url, http_client=http, max_sse_event_size=self.max_message_bytes)

    async def _list_tools(self, client: Client) -> None:
        """Its tools, up to `max_tools`, into the registry (a listing that changed nothing leaves
        the registry as it is)."""
        cap = self.config.max_tools
        listed: list[mcp_types.Tool] = []
        cursor: str | None = None
        for _ in range(_LIST_PAGES):
            page = await client.list_tools(cursor=cursor, cache_mode="refresh")
            listed.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None or len(listed) > cap:
                break
        if len(listed) > cap:
            self._warnings.warn(f"it lists more than {cap} tools: the first {cap} are kept (max_tools)")
            del listed[cap:]
        tools = await self._built.update(listed)
        self._listed_at = time.monotonic()
        registered = [self._registry.get(name) for name in self.tools]
        if len(registered) != len(tools) or any(old is not new for old, new in zip(registered, tools, strict=True)):
            for name in self._registry.replace_source(self.source, tools, on_request=self.on_request):
                self._warnings.warn(f"tool {name!r} left out: a tool of that name is already registered")
            # What it has in the registry now (a server may list a name twice: the first one counts).
            self.tools = tuple(name for name in dict.fromkeys(t.name for t in tools)
                               if self._registry.source_of(name) == self.source)
        self._warnings.listed()

    def _screened(self, item: Any) -> Any:
        """A message from the server's transport, its tool listings screened. One tool past
        max_tools is let through, for _list_tools to tell that there were more."""
        return screened_message(item, self.protocol_version, self._warnings, self.config.max_tools + 1)

    def _build_tool(self, listed: mcp_types.Tool) -> Tool:
        hints = listed.annotations
        annotations = hints.model_dump(by_alias=True, exclude_none=True) if hints is not None else None
        origin = ToolOrigin("mcp", self.name, METHOD_CALL_TOOL, listed.name, self.transport_name,
                            self.protocol_version, hints.read_only_hint if hints is not None else None, annotations)
        return build_tool(origin, listed, self.call, self.config.concurrent, self.config.timeout_seconds)

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, mcp_types.ToolListChangedNotification):
            self._relist = True
            self._wake.set()
        elif isinstance(message, ValueError):  # a line that is not a JSON-RPC message (a stray print, say)
            log.warning("MCP server %r sent something that is not an MCP message; ignored: %s", self.name,
                        _reason(message))
        elif isinstance(message, Exception):
            self._lose(_reason(message))

    def _lose(self, reason: str) -> None:
        """The connection is gone (or no longer to be trusted): the session loop ends it."""
        if self._lost is None:
            self._lost = reason
        self._wake.set()

    # --- calls ----------------------------------------------------------------------------------

    async def call(self, tool: str, arguments: dict[str, Any]) -> ToolResult:
        """`tools/call` with the trace context in `params._meta`; a server that is not there, or
        goes during the call, makes an error result saying so."""
        client = self._client
        if client is None or self.state != "up":
            return self._unavailable(f"it is not connected ({self.error or 'connecting'})")
        meta: dict[str, str] = {}
        self._hooks.inject_context(meta)
        try:
            result = await client.call_tool(tool, arguments, meta=cast(mcp_types.RequestParamsMeta, meta) or None)
        except MCPError as exc:
            if exc.error.code != mcp_types.CONNECTION_CLOSED:
                return ToolResult(content=f"MCP server '{self.name}' refused the call of its tool '{tool}': "
                                          f"{exc.error.message}", is_error=True, error_type="mcp_error")
            # The client's words when it says more than that the connection closed (an SSE answer over
            # mcp_max_message_bytes, say): they reach the log and /readyz.
            said = exc.error.message
            self._lose(said if said and said != "Connection closed" else "the server closed the connection")
            return self._unavailable("the connection closed during the call; whether the tool ran is unknown")
        except _TRANSPORT_FAILURES as exc:  # the connection failed under the call
            self._lose(_reason(exc))
            return self._unavailable("the connection failed during the call; whether the tool ran is unknown")
        except Exception as exc:  # an answer the client would not take (one that breaks its outputSchema, say)
            return ToolResult(content=f"MCP server '{self.name}' answered the call of its tool '{tool}' with a "
                                      f"result that could not be read: {_reason(exc)}", is_error=True,
                              error_type="mcp_error")
        return tool_result(result)

    def _unavailable(self, why: str) -> ToolResult:
        return ToolResult(content=f"MCP server '{self.name}' is unavailable: {why}. The gateway reconnects to it "
                                  "on its own; try the call again later.", is_error=True, error_type=UNAVAILABLE)


# How a transport fails under a call; anything else a call raises is about the answer itself.
_TRANSPORT_FAILURES = (OSError, httpx2.TransportError, httpx2.HTTPStatusError, anyio.ClosedResourceError,
                       anyio.BrokenResourceError, anyio.EndOfStream, BaseExceptionGroup)
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.IGNORECASE)


def _reason(exc: BaseException) -> str:
    """A failure in a few words, the first of a group's (anyio raises groups). URLs are left out:
    a server's URL may hold its key, and these words reach the log and /readyz."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = _URL.sub("<url>", str(exc)) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


class _WatchedStream:
    """The server's side of a transport, telling when it ends (a stdio server that exited), each
    message it yields passed through `screen` first."""

    def __init__(self, inner: Any, ended: Callable[[str], None], screen: Callable[[Any], Any]) -> None:
        self._inner = inner
        self._ended = ended
        self._screen = screen

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def receive(self) -> Any:
        try:
            item = await self._inner.receive()
        except Exception:
            self._ended("the server closed the connection")
            raise
        return self._screen(item)

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _WatchedStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()  # which reports the end
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _WatchedStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


@asynccontextmanager
async def _watched(transport: Transport, ended: Callable[[str], None],
                   screen: Callable[[Any], Any]) -> AsyncIterator[Any]:
    async with transport as (read_stream, write_stream):
        yield _WatchedStream(read_stream, ended, screen), write_stream
