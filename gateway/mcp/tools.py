"""An MCP server's tools as registry Tools: the names they get, their declaration, and what their
results become."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types

from gateway.tools import Tool, ToolResult
from gateway.tools.params import without_titles
from gateway.tools.results import ToolOrigin

NAME_LIMIT = 64  # OpenAI's function names: ^[a-zA-Z0-9_-]{1,64}$
_HASH_CHARS = 8
_OUTSIDE_NAME = re.compile(r"[^a-zA-Z0-9_-]")
METHOD_CALL_TOOL = "tools/call"

CallTool = Callable[[str, dict[str, Any]], Awaitable[ToolResult]]  # (the server's tool name, arguments)


def registered_name(server: str, tool: str) -> str:
    """`{server}__{tool}`, as it is when that is a valid OpenAI function name. Otherwise every
    character other than a letter, digit, '_' or '-' becomes '_', the result is cut to 55
    characters, and '_' and the first 8 hex digits of the SHA-256 of `{server}__{tool}` are added:
    names stay distinct and the same across restarts. Server names hold no '__' (the settings
    check it), so two servers' tools never share a name."""
    plain = f"{server}__{tool}"
    if len(plain) <= NAME_LIMIT and not _OUTSIDE_NAME.search(plain):
        return plain
    digest = hashlib.sha256(plain.encode()).hexdigest()[:_HASH_CHARS]
    return f"{_OUTSIDE_NAME.sub('_', plain)[:NAME_LIMIT - _HASH_CHARS - 1]}_{digest}"


def build_tool(origin: ToolOrigin, listed: mcp_types.Tool, call: CallTool, concurrent: bool,
               timeout: float | None) -> Tool:
    """The registry's Tool for one listed MCP tool: its `inputSchema` as the parameters, checked
    in the parse step (values included), and `tools/call` as the body. Raises
    ToolDeclarationError for a tool whose schema cannot be used."""
    schema = without_titles(dict(listed.input_schema))  # titles cost the model tokens, and say nothing

    async def call_remote(args: dict[str, Any]) -> ToolResult:
        return await call(listed.name, args)

    return Tool(name=registered_name(origin.server, listed.name),
                description=listed.description or listed.title or "",
                parameters_schema=schema, validate_schema=True, function=call_remote,
                concurrent=concurrent, timeout=timeout, origin=origin)


def tool_result(result: mcp_types.CallToolResult) -> ToolResult:
    """A `tools/call` result as the model reads it. Text (and text resources) becomes the tool
    message's text; images (and image resources) become image parts beside it; audio, other
    binary resources and resource links are named in a line of text. `structuredContent` is the
    processed content, and the message's text when there is no other content. `isError` makes the
    outcome an error."""
    parts = [part for block in result.content for part in _parts(block)]
    text_only = all(part["type"] == "text" for part in parts)
    content: str | list[dict[str, Any]] = "\n".join(part["text"] for part in parts) if text_only else parts
    if not parts and result.structured_content is not None:
        content = json.dumps(result.structured_content, ensure_ascii=False)
    return ToolResult(content=content, processed_content=result.structured_content, is_error=bool(result.is_error))


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _image(mime_type: str, data: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": f"data:{mime_type};base64,{data}"}}


def _parts(block: mcp_types.ContentBlock) -> list[dict[str, Any]]:
    if isinstance(block, mcp_types.TextContent):
        return [_text(block.text)]
    if isinstance(block, mcp_types.ImageContent):
        return [_image(block.mime_type, block.data)]
    if isinstance(block, mcp_types.AudioContent):
        return [_text(f"[audio ({block.mime_type}) not shown]")]
    if isinstance(block, mcp_types.ResourceLink):
        return [_text(f"[resource {block.name}: {block.uri}]")]
    if isinstance(block, mcp_types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, mcp_types.TextResourceContents):
            return [_text(f"[resource {resource.uri}]\n{resource.text}")]
        mime = resource.mime_type or "application/octet-stream"
        if mime.startswith("image/"):
            return [_text(f"[resource {resource.uri}]"), _image(mime, resource.blob)]
        return [_text(f"[resource {resource.uri} ({mime}) not shown]")]
    return [_text(f"[{getattr(block, 'type', 'unknown')} content not shown]")]
