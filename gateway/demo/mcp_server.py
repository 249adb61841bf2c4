"""The example tools as an MCP server over stdio: `toolspan mcp-examples`.

`toolspan serve --mcp-examples` and `toolspan demo --mcp` start it as an MCP source, so the tools
reach the gateway through MCP; any other MCP client (Claude Desktop, an IDE) can start it too. The
calls run through a ToolExecutor of its own, without telemetry: the gateway that calls it traces
them.
"""

from __future__ import annotations

import sys
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

from gateway.demo.tools import demo_registry
from gateway.mcp.server import call_result, listed_tool, tool_call
from gateway.settings.model import Settings
from gateway.settings.parts import McpServer
from gateway.tools import ToolExecutor, ToolRegistry, Turn

SERVER_NAME = "toolspan-examples"
SOURCE_NAME = "examples"  # its tools' names on the gateway: examples__get_weather, ...


def with_mcp_examples(settings: Settings) -> Settings:
    """`settings` with this server as an MCP source, started over stdio by the gateway."""
    source = McpServer(command=sys.executable, args=["-m", "gateway", "mcp-examples"], required=True)
    return settings.model_copy(update={"mcp_servers": {**settings.mcp_servers, SOURCE_NAME: source}})


def examples_server(registry: ToolRegistry, executor: ToolExecutor) -> Server[Any]:
    """An MCP server offering `registry`'s tools, whose calls `executor` runs."""

    async def list_tools(ctx: ServerRequestContext[Any, Any],
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[listed_tool(tool) for tool in registry])

    async def call_tool(ctx: ServerRequestContext[Any, Any],
                        params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name not in registry:
            raise MCPError(code=types.INVALID_PARAMS, message=f"there is no tool named {params.name!r}")
        return call_result(await executor.run_call(tool_call(params), Turn()))

    return Server(SERVER_NAME, on_list_tools=list_tools, on_call_tool=call_tool)


async def serve_examples() -> None:
    """Serve the example tools on stdin and stdout until the client closes them."""
    registry = demo_registry()
    async with ToolExecutor(registry) as executor, stdio_server() as (reads, writes):
        server = examples_server(registry, executor)
        await server.run(reads, writes, server.create_initialization_options())
