"""The configured MCP servers as sources of the registry's tools, for as long as the app runs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import mcp_types
from aiohttp import web

from gateway.mcp.connection import McpConnection
from gateway.mcp.stdio import GRACE_SECONDS
from gateway.settings.parts import MCP_MAX_MESSAGE_BYTES, McpServer
from gateway.tools import ToolHooks, ToolRegistry

log = logging.getLogger("toolspan.mcp")
# A connection's close, its stdio server's two graces included (gateway.mcp.stdio), with a margin;
# what is still closing then is cancelled again, which kills a stdio server's processes at once.
STOP_SECONDS = 2 * GRACE_SECONDS + 3.0
_KILLED_SECONDS = 2.0


def _client_info() -> mcp_types.Implementation:
    try:
        installed = version("toolspan")
    except PackageNotFoundError:
        installed = "0"
    return mcp_types.Implementation(name="toolspan", version=installed)


class McpSources:
    """One `McpConnection` per configured server, each kept by a task of its own. Start-up waits
    for every server's first attempt (bounded by its connect timeout), so the tools of the servers
    that answered are registered before the first request; the others join when they come up."""

    def __init__(self, servers: Mapping[str, McpServer], registry: ToolRegistry, hooks: ToolHooks,
                 max_message_bytes: int = MCP_MAX_MESSAGE_BYTES, on_request: bool = False) -> None:
        """`on_request`: the servers' tools are registered but offered only to a request that declares
        the server (responses_mcp_servers), never to every request."""
        info = _client_info()
        self.connections = {name: McpConnection(name, config, registry, hooks, info, max_message_bytes, on_request)
                            for name, config in servers.items()}
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        for connection in self.connections.values():
            self._tasks.append(asyncio.create_task(connection.run(), name=f"mcp server {connection.name}"))
        await asyncio.gather(*(c.wait_until(lambda c: c.state != "connecting") for c in self.connections.values()))

    async def stop(self) -> None:
        """End every connection, in at most STOP_SECONDS and a little more, whatever the servers do."""
        for task in self._tasks:
            task.cancel()
        pending: set[asyncio.Task[None]] = set(self._tasks)
        for bound in (STOP_SECONDS, _KILLED_SECONDS):
            if not pending:
                break
            _, pending = await asyncio.wait(pending, timeout=bound)
            for task in pending:
                task.cancel()
        for task in self._tasks:
            if task in pending:  # only a process stuck in the kernel gets here: it is left to exit on its own
                log.warning("%s did not end within %g s; left behind", task.get_name(), STOP_SECONDS + _KILLED_SECONDS)
            elif not task.cancelled() and (error := task.exception()) is not None:
                log.error("%s had failed", task.get_name(), exc_info=error)
        self._tasks.clear()

    async def lifetime(self, app: web.Application) -> AsyncIterator[None]:
        """For `app.cleanup_ctx`: connected while the app runs."""
        await self.start()
        yield
        await self.stop()

    def status(self) -> list[dict[str, Any]]:
        """What /readyz shows of each server."""
        return [{"name": c.name, "state": c.state, "required": c.config.required, "transport": c.transport_name,
                 "tools": len(c.tools), "disconnects": c.disconnects, **({"error": c.error} if c.error else {})}
                for c in self.connections.values()]

    def why_down(self, name: str) -> str | None:
        """Why server `name` is not up (None: it is up, or there is no such server)."""
        connection = self.connections.get(name)
        if connection is None or connection.state == "up":
            return None
        return connection.error or connection.state

    def required_down(self) -> list[str]:
        """The servers marked `required` that are not up."""
        return [c.name for c in self.connections.values() if c.config.required and c.state != "up"]
