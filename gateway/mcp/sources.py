"""The configured MCP servers as sources of the registry's tools, for as long as the app runs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import mcp_types
from aiohttp import web

from gateway.mcp.connection import McpConnection
from gateway.settings import McpServer
from gateway.tools import ToolHooks, ToolRegistry


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

    def __init__(self, servers: Mapping[str, McpServer], registry: ToolRegistry, hooks: ToolHooks) -> None:
        info = _client_info()
        self.connections = {name: McpConnection(name, config, registry, hooks, info)
                            for name, config in servers.items()}
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        for connection in self.connections.values():
            self._tasks.append(asyncio.create_task(connection.run(), name=f"mcp server {connection.name}"))
        await asyncio.gather(*(c.wait_until(lambda c: c.state != "connecting") for c in self.connections.values()))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
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

    def required_down(self) -> list[str]:
        """The servers marked `required` that are not up."""
        return [c.name for c in self.connections.values() if c.config.required and c.state != "up"]
