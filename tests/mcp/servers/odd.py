"""An MCP server that misbehaves in ways real ones do, over stdio, written with the `mcp` package's
low-level server: it prints a banner on stdout before speaking MCP (`odd.py banner`), lists one tool name twice, has a
tool whose result breaks its own outputSchema, and one whose schema has a pattern Python's regex
engine would take seconds over and a `$ref` that leads nowhere."""

from __future__ import annotations

import sys
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server

ECHO = types.Tool(name="echo", description="Echo", input_schema={
    "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})
TOOLS = [
    ECHO,
    ECHO,  # the same name again
    types.Tool(name="count", description="Counts, but says so in words",
               input_schema={"type": "object", "properties": {}},
               output_schema={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
    types.Tool(name="match", description="A hostile schema", input_schema={
        "type": "object",
        "properties": {"word": {"type": "string", "pattern": "^(a+)+$"}, "thing": {"$ref": "#/$defs/nowhere"}}}),
]


async def list_tools(ctx: ServerRequestContext[Any, Any],
                     params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams) -> types.CallToolResult:
    arguments = params.arguments or {}
    if params.name == "count":
        return types.CallToolResult(content=[types.TextContent(text="three")], structured_content={"n": "three"})
    return types.CallToolResult(content=[types.TextContent(text=f"{params.name}: {sorted(arguments.items())}")])


async def main() -> None:
    if "banner" in sys.argv:
        print("odd server 1.0 starting", flush=True)  # not MCP: a banner some servers print
    server: Server[Any] = Server("odd", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (reads, writes):
        await server.run(reads, writes, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
