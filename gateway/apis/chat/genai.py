"""Chat Completions messages as GenAI messages (gateway.apis.genai): a system message stays in the
history, a `tool` message is a tool_call_response, an assistant's tool_calls are tool_call parts;
`tools` (and the legacy `functions`) as tool definitions."""

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


def chat_message(message: Any) -> Message | None:
    if not isinstance(message, Mapping):
        return None
    role = str(message.get("role", "user"))
    if role == "tool":
        return {"role": "tool", "parts": [response(message.get("tool_call_id"), message.get("content"))]}
    found = parts(message.get("content"))
    if isinstance(message.get("refusal"), str):
        found.append({"type": "text", "content": message["refusal"]})
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            found.append(tool_call(call.get("id"), function.get("name"), function.get("arguments")))
    return {"role": role, "parts": found}


def chat_tool(spec: Mapping[str, Any]) -> Definition | None:
    """A declared tool: a function's definition, or a custom tool's type and name."""
    kind = spec.get("type", "function")
    if kind == "function":
        function = spec.get("function")
        if not isinstance(function, Mapping):
            return None
        return function_definition(function.get("name"), function.get("description"), function.get("parameters"))
    inner = spec.get(str(kind))
    return other_definition(kind, inner.get("name") if isinstance(inner, Mapping) else None)


def legacy_function(spec: Mapping[str, Any]) -> Definition | None:
    return function_definition(spec.get("name"), spec.get("description"), spec.get("parameters"))


class ChatMessages:
    """A Chat request's messages; an answer's one message."""

    def instructions(self, body: Mapping[str, Any]) -> str | None:
        return None  # a system message stays in the history

    def history(self, body: Mapping[str, Any]) -> list[Message]:
        return [m for m in map(chat_message, body.get("messages") or ()) if m is not None]

    def tools(self, body: Mapping[str, Any]) -> list[Definition]:
        return definitions(body.get("tools"), chat_tool) + definitions(body.get("functions"), legacy_function)

    def answer_parts(self, output: Sequence[Mapping[str, Any]]) -> list[Part]:
        found = chat_message(output[0]) if output else None
        return found["parts"] if found is not None else []
