"""Responses API input and output items as GenAI messages (gateway.apis.genai): `instructions`
apart, a function_call a tool_call part, a function_call_output a tool_call_response; reasoning
items carry no content and are left out; `tools` as tool definitions."""

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


def item_message(item: Any) -> Message | None:
    """One item (input or output) as a message, or None for one of no content (reasoning)."""
    if not isinstance(item, Mapping):
        return None
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        return {"role": str(item.get("role", "user")), "parts": parts(item.get("content"))}
    if kind == "function_call":
        return {"role": "assistant", "parts": [tool_call(item.get("call_id"), item.get("name"), item.get("arguments"))]}
    if kind == "function_call_output":
        return {"role": "tool", "parts": [response(item.get("call_id"), item.get("output"))]}
    if kind == "reasoning":
        return None
    return {"role": "assistant" if str(kind).endswith("_call") else "user", "parts": [{"type": str(kind)}]}


def responses_tool(spec: Mapping[str, Any]) -> Definition | None:
    """A declared tool (the flat shape): a function's definition; any other (custom, web search,
    an MCP server ...) its type and name (an MCP server's label)."""
    kind = spec.get("type")
    if kind == "function":
        return function_definition(spec.get("name"), spec.get("description"), spec.get("parameters"))
    return other_definition(kind, spec.get("name") or spec.get("server_label")) if isinstance(kind, str) else None


class ResponsesMessages:
    """A Responses request's input (a string is one user message); an answer's output items."""

    def instructions(self, body: Mapping[str, Any]) -> str | None:
        found = body.get("instructions")
        return found if isinstance(found, str) and found else None

    def history(self, body: Mapping[str, Any]) -> list[Message]:
        raw = body.get("input")
        if isinstance(raw, str):
            return [{"role": "user", "parts": [{"type": "text", "content": raw}]}]
        return [m for m in map(item_message, raw or ()) if m is not None]

    def tools(self, body: Mapping[str, Any]) -> list[Definition]:
        return definitions(body.get("tools"), responses_tool)

    def answer_parts(self, output: Sequence[Mapping[str, Any]]) -> list[Part]:
        return [part for item in output for part in (item_message(item) or {"parts": []})["parts"]]
