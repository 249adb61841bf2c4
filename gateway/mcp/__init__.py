"""MCP: servers whose tools join the registry (client side)."""

from gateway.mcp.connection import UNAVAILABLE, McpConnection
from gateway.mcp.sources import McpSources
from gateway.mcp.tools import registered_name, tool_result

__all__ = ["UNAVAILABLE", "McpConnection", "McpSources", "registered_name", "tool_result"]
