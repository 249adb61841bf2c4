"""Conversations as the OpenTelemetry GenAI conventions word them, the parts every wire API's
reading shares: a message is `{"role", "parts"}`, a part `{"type": "text", "content"}`,
`{"type": "tool_call", "id", "name", "arguments"}`, `{"type": "tool_call_response", "id",
"response"}` or `{"type": "reasoning", "content"}`; any other content keeps only its type (an image
or a file is not copied). The tools a request offers read as the conventions' tool definitions: a
function `{"type": "function", "name", "description", "parameters"}` (its JSON Schema), any other
tool `{"type", "name"}`. Each adapter reads its own API with these (its `genai`, a
gateway.instrumentation.MessageView), and telemetry masks and bounds what they give
(telemetry.messages)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

Message = dict[str, Any]
Part = dict[str, Any]
Definition = dict[str, Any]


def text_of(content: Any) -> list[str | Part]:
    """Message content (a string, or a list of typed parts of any API) as text pieces, with the
    type of each piece that is not text."""
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    pieces: list[str | Part] = []
    for part in content if isinstance(content, list) else [content]:
        if isinstance(part, Mapping) and isinstance(part.get("text"), str):
            pieces.append(part["text"])
        elif isinstance(part, Mapping) and isinstance(part.get("refusal"), str):
            pieces.append(part["refusal"])
        elif isinstance(part, Mapping):
            pieces.append({"type": str(part.get("type", "unknown"))})
    return pieces


def parts(content: Any) -> list[Part]:
    return [{"type": "text", "content": p} if isinstance(p, str) else p for p in text_of(content)]


def _arguments(raw: Any) -> Any:
    """A call's arguments: decoded when they are JSON (the conventions' preference), else the text."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def tool_call(call_id: Any, name: Any, arguments: Any) -> Part:
    return {"type": "tool_call", "id": call_id, "name": name, "arguments": _arguments(arguments)}


def response(call_id: Any, output: Any) -> Part:
    text = output if isinstance(output, str) else "".join(p for p in text_of(output) if isinstance(p, str))
    return {"type": "tool_call_response", "id": call_id, "response": text}


def function_definition(name: Any, description: Any, parameters: Any) -> Definition | None:
    """A function tool's definition; None for one without a name (the provider refuses it anyway)."""
    if not isinstance(name, str) or not name:
        return None
    found: Definition = {"type": "function", "name": name}
    if isinstance(description, str):
        found["description"] = description
    if isinstance(parameters, Mapping):
        found["parameters"] = parameters
    return found


def other_definition(kind: Any, name: Any) -> Definition:
    """A tool that is not a function (a custom tool, a provider's own such as web search): its
    type, and its name where it has one (else its type names it)."""
    return {"type": str(kind), "name": name if isinstance(name, str) and name else str(kind)}


def definitions(specs: Any, definition: Callable[[Mapping[str, Any]], Definition | None]) -> list[Definition]:
    """The definitions of a request's declared tools (`specs`, its `tools`), each read by `definition`."""
    if not isinstance(specs, list):
        return []
    found = (definition(spec) for spec in specs if isinstance(spec, Mapping))
    return [item for item in found if item is not None]
