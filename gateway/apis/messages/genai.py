"""Anthropic Messages as GenAI messages (gateway.apis.genai): `system` apart, content blocks as
parts (thinking as reasoning), and a user message of tool_result blocks alone a tool message;
`tools` as tool definitions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gateway.apis.genai import (
    Definition,
    Message,
    Part,
    definitions,
    function_definition,
    other_definition,
    parts,
    response,
    tool_call,
)


def block_part(block: Any) -> Part:
    """One content block as a part."""
    if not isinstance(block, Mapping):
        return {"type": "unknown"}
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "content": str(block.get("text", ""))}
    if kind == "thinking":
        return {"type": "reasoning", "content": str(block.get("thinking", ""))}
    if kind == "tool_use":
        return tool_call(block.get("id"), block.get("name"), block.get("input"))
    if kind == "tool_result":
        return response(block.get("tool_use_id"), block.get("content"))
    return {"type": str(kind or "unknown")}


def anthropic_message(message: Any) -> Message | None:
    if not isinstance(message, Mapping):
        return None
    content = message.get("content")
    found = parts(content) if isinstance(content, str) else [block_part(b) for b in content or ()]
    answers = bool(found) and all(part["type"] == "tool_call_response" for part in found)
    return {"role": "tool" if answers else str(message.get("role", "user")), "parts": found}


def anthropic_tool(spec: Mapping[str, Any]) -> Definition | None:
    """A declared tool: a client tool (it has an input schema) as a function; a server tool (web
    search, code execution ...) its type and name."""
    if "input_schema" in spec or spec.get("type") in (None, "custom"):
        return function_definition(spec.get("name"), spec.get("description"), spec.get("input_schema"))
    return other_definition(spec.get("type"), spec.get("name"))


class AnthropicMessages:
    """A Messages request's messages and system; an answer's content blocks."""

    def instructions(self, body: Mapping[str, Any]) -> str | None:
        found = body.get("system")
        if isinstance(found, list):  # system as text blocks
            found = "\n".join(str(b.get("text", "")) for b in found if isinstance(b, Mapping))
        return found if isinstance(found, str) and found else None

    def history(self, body: Mapping[str, Any]) -> list[Message]:
        return [m for m in map(anthropic_message, body.get("messages") or ()) if m is not None]

    def tools(self, body: Mapping[str, Any]) -> list[Definition]:
        return definitions(body.get("tools"), anthropic_tool)

    def answer_parts(self, output: Sequence[Mapping[str, Any]]) -> list[Part]:
        return [block_part(block) for block in output]
