"""The gateway's tool registry as an MCP server, built on the official SDK's low-level `Server`
and its streamable HTTP session manager (an ASGI app; gateway.routes.mcp serves it at /mcp).

`tools/list` offers the tools the caller's key allows, each with the schema the model is offered
and its description, read from the registry at every request (MCP sources change it while the
gateway runs). `tools/call` runs through the gateway's ToolExecutor, like every other call: the
same `tool.call` span, metrics, rejection diagnostics and retry classification. A rejected or
failed call is a result with `isError: true` whose text the model can act on; a name the caller
has no tool by (unknown, or outside its allowlist) is a JSON-RPC "invalid params" error, as the
MCP specification asks for an unknown tool.

Sessions (those of the 2025 revisions) are bounded in all by the SDK's session manager, and per
gateway key by gateway.mcp.key_sessions; a session with no request for `mcp_session_idle_seconds`
ends.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import mcp_types as types
import pydantic_core
from aiohttp import web
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.types import Message, Receive, Scope, Send

from gateway.caller import Caller
from gateway.mcp.key_sessions import KeySessions
from gateway.settings.model import Settings
from gateway.tools import Tool, ToolCall, ToolExecutor, ToolOutcome, ToolRegistry

# The route puts the request's Caller in the ASGI scope under this key; a handler reads it off the
# HTTP request the SDK hands it. (The SDK also runs each handler in the context of the HTTP request
# that carried its message, so the tool.call spans nest under that request's span.)
CALLER_SCOPE_KEY = "toolspan.caller"
_NO_SUCH_TOOL = ("unknown_tool", "not_allowed")  # for this caller: a JSON-RPC error, as for an unknown tool


def _version() -> str:
    try:
        return importlib.metadata.version("toolspan")
    except importlib.metadata.PackageNotFoundError:
        return ""


def _header(scope: Scope, name: str) -> str | None:
    """The first value of a request header (the SDK reads the first as well)."""
    wanted = name.lower().encode("latin-1")
    return next((bytes(v).decode("latin-1") for k, v in scope.get("headers", ()) if bytes(k).lower() == wanted), None)


def _of_a_sessionless_revision(scope: Scope) -> bool:
    """A request of a protocol revision without sessions (2026-07-28 on), which the SDK serves
    apart, whatever its headers: it neither opens nor uses one. The SDK's own test, on the same header."""
    version = _header(scope, MCP_PROTOCOL_VERSION_HEADER)
    return version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS


def _user(principal: str) -> AuthenticatedUser:
    """The SDK's user for a gateway key, by which a session answers only the key that opened it:
    the key's name stands for it, and the secret stays out."""
    return AuthenticatedUser(AccessToken(token="", client_id=principal, scopes=[]))


@dataclass
class _AnswerHead:
    """The status and session id the SDK's answer begins with, kept as soon as it is sent (so known
    even when the request is cancelled afterwards)."""

    status: int | None = None
    session_id: str | None = None

    def watching(self, send: Send) -> Send:
        async def watched(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.status = int(message["status"])
                self.session_id = _header({"headers": message.get("headers", ())}, MCP_SESSION_ID_HEADER)
            await send(message)
        return watched


def _caller_of(ctx: ServerRequestContext[Any, Any]) -> Caller:
    found = getattr(ctx.request, "scope", {}).get(CALLER_SCOPE_KEY)
    if not isinstance(found, Caller):  # only if the app were served other than by gateway.routes.mcp
        raise MCPError(code=types.INTERNAL_ERROR, message="the request reached the MCP server without its caller")
    return found


def _block(part: dict[str, Any]) -> types.TextContent | types.ImageContent:
    """One content part of an outcome (OpenAI's shape) as an MCP content block."""
    if part.get("type") == "text":
        return types.TextContent(text=str(part.get("text", "")))
    url = str(part.get("image_url", {}).get("url", "")) if part.get("type") == "image_url" else ""
    head, _, data = url.partition(";base64,")
    if head.startswith("data:") and data:
        return types.ImageContent(data=data, mime_type=head.removeprefix("data:"))
    return types.TextContent(text=json.dumps(part, ensure_ascii=False))


def call_result(outcome: ToolOutcome) -> types.CallToolResult:
    """An outcome as MCP returns it: the model-facing content; a native dict result (or an MCP
    tool's structured content) as `structuredContent`; anything but ok is an error."""
    content = outcome.content
    blocks = [types.TextContent(text=content)] if isinstance(content, str) else [_block(p) for p in content]
    processed = outcome.processed_content
    structured = pydantic_core.to_jsonable_python(processed, fallback=repr) if isinstance(processed, dict) else None
    return types.CallToolResult(content=list(blocks), structured_content=structured,
                                is_error=outcome.status != "ok")


def listed_tool(tool: Tool) -> types.Tool:
    """A registered tool as `tools/list` shows it: the schema the model is offered as its input schema."""
    return types.Tool(name=tool.name, description=tool.description or None, input_schema=tool.schema)


def tool_call(params: types.CallToolRequestParams) -> ToolCall:
    """A `tools/call` as the executor runs it, under a call id of its own (MCP has none)."""
    return ToolCall(f"call_{secrets.token_hex(12)}", params.name, json.dumps(params.arguments or {}))


class McpEndpoint:
    """The MCP server and its session manager, for the life of the app: `lifetime` is the app's
    cleanup context, `handle` the ASGI app, `closing` ends event streams at shutdown."""

    def __init__(self, registry: ToolRegistry, executor: ToolExecutor, settings: Settings) -> None:
        self.registry = registry
        self.executor = executor
        server: Server[Any] = Server("toolspan", version=_version(), on_list_tools=self._list_tools,
                                     on_call_tool=self._call_tool)
        # The SDK's own per-message SERVER span would be a second root beside the gateway's
        # request span; the request span and the tool.call spans are the telemetry contract.
        server.middleware.clear()
        # One JSON answer per POST: no event stream to keep open per call.
        # The Host and Origin checks against DNS rebinding the MCP specification asks for are the
        # gateway's, for every route (gateway.http.browsers, in the app's middleware), so the SDK's are off:
        # one rule, and the gateway's OpenAI-shaped refusals.
        no_second_check = TransportSecuritySettings(enable_dns_rebinding_protection=False)
        self.sessions = StreamableHTTPSessionManager(server, json_response=True, security_settings=no_second_check,
                                                     max_request_body_size=settings.max_body_bytes,
                                                     max_sessions=settings.mcp_max_sessions,
                                                     session_idle_timeout=settings.mcp_session_idle_seconds)
        # The SDK bounds the sessions of all keys together; this bounds each key's share.
        self.key_sessions = KeySessions(settings.mcp_max_sessions_per_key, settings.mcp_session_idle_seconds)
        self.max_sessions = settings.mcp_max_sessions
        self.closing = asyncio.Event()

    def scope_of(self, caller: Caller) -> dict[str, Any]:
        """What the ASGI scope of a request by `caller` carries: the caller, and its key as the
        SDK's user, so that a session answers only the key that opened it."""
        scope: dict[str, Any] = {CALLER_SCOPE_KEY: caller}
        if caller.principal is not None:
            scope["user"] = _user(caller.principal)
        return scope

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The SDK answers; a request by a gateway key is counted against the key's sessions first
        (a TooManySessions refusal, raised before anything is sent, is the gateway's to answer)."""
        caller = scope.get(CALLER_SCOPE_KEY)
        principal = caller.principal if isinstance(caller, Caller) else None
        if principal is None or _of_a_sessionless_revision(scope):
            await self.sessions.handle_request(scope, receive, send)  # without keys: only the SDK's bound
            return
        visit = self.key_sessions.enter(principal, _header(scope, MCP_SESSION_ID_HEADER))
        if visit.session_id is None:
            await self._make_room(principal)
        head = _AnswerHead()
        try:
            await self.sessions.handle_request(scope, receive, head.watching(send))
        finally:
            self.key_sessions.leave(visit, head.status, head.session_id, deleting=scope.get("method") == "DELETE")

    async def _make_room(self, principal: str) -> None:
        """With every session taken, end the one KeySessions.to_end names (another key's, which
        holds more), as its own key's DELETE would: the SDK forgets it, and its id answers 404."""
        found = self.key_sessions.to_end(principal, self.max_sessions)
        if found is None:
            return
        owner, session_id = found
        visit = self.key_sessions.enter(owner, session_id)
        head = _AnswerHead()

        async def nothing_more() -> Message:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def unheard(message: Message) -> None:
            return None

        ending: Scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "DELETE",
                         "scheme": "http", "path": "/mcp", "raw_path": b"/mcp", "root_path": "", "query_string": b"",
                         "headers": [(MCP_SESSION_ID_HEADER.encode(), session_id.encode())], "client": None,
                         "server": None, "user": _user(owner)}
        try:
            await self.sessions.handle_request(ending, nothing_more, head.watching(unheard))
        finally:
            self.key_sessions.leave(visit, head.status, head.session_id, deleting=True)

    async def lifetime(self, app: web.Application) -> AsyncIterator[None]:
        """Runs the session manager on a task of its own: its task group must end on the task
        that started it, and aiohttp may clean up on another one."""
        stop = asyncio.Event()
        running = asyncio.get_running_loop().create_future()

        async def run() -> None:
            async with self.sessions.run():
                running.set_result(None)
                await stop.wait()

        task = asyncio.create_task(run())
        await asyncio.wait([task, running], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()  # it failed to start: say why
        yield
        stop.set()
        await task

    async def close_streams(self, app: web.Application) -> None:
        self.closing.set()

    async def _list_tools(self, ctx: ServerRequestContext[Any, Any],
                          params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        allowed = _caller_of(ctx).allowed
        return types.ListToolsResult(tools=[
            listed_tool(tool) for tool in self.registry
            if (allowed is None or tool.name in allowed) and not self.registry.on_request(tool.name)])

    async def _call_tool(self, ctx: ServerRequestContext[Any, Any],
                         params: types.CallToolRequestParams) -> types.CallToolResult:
        caller = _caller_of(ctx)
        outcome = await self.executor.run_call(tool_call(params), caller.turn(0), caller.allowed)
        if outcome.rejection is not None and outcome.rejection.reason in _NO_SUCH_TOOL:
            raise MCPError(code=types.INVALID_PARAMS, message=outcome.content_text())
        return call_result(outcome)
