"""Names a caller or a model chooses, made bounded for metric labels and spans: model names (with
their chat span names), the client's tool names, and each gateway tool's parameters as span text."""

from __future__ import annotations

import json
from dataclasses import dataclass

from gateway.tools import Tool
from telemetry import names
from telemetry.bounds import bounded


@dataclass(frozen=True, slots=True)
class ChatModel:
    """A requested model as a chat span and its metrics name it. Made once per distinct model
    (ModelLabels keeps them), so a provider call makes one dict lookup rather than two bounded()
    and the span name's f-string."""

    label: str  # the metrics' model label
    span_name: str  # `chat {model}`, bounded
    request_model: str  # gen_ai.request.model, bounded

    @classmethod
    def of(cls, model: str, label: str) -> ChatModel:
        return cls(label, bounded(f"{names.SPAN_CHAT_PREFIX} {model}"), bounded(model))


class ModelLabels:
    """Model names as metric labels: the first `limit` distinct ones of at most `max_chars`
    characters, then one shared label, since a caller can send any string as a model. A name too
    long to be a label takes no place among the distinct ones. The distinct ones are kept as
    ChatModels, their span names made once."""

    def __init__(self, limit: int, max_chars: int = 128) -> None:
        self._seen: dict[str, ChatModel] = {}
        self._limit = limit
        self._max_chars = max_chars

    def chat_model(self, model: str) -> ChatModel:
        found = self._seen.get(model)
        if found is not None:
            return found
        if len(self._seen) >= self._limit or len(model) > self._max_chars:
            return ChatModel.of(model, names.OTHER_MODEL)
        found = self._seen[model] = ChatModel.of(model, model)
        return found


class ToolParameters:
    """Each gateway tool's parameters (its declared JSON Schema) as the JSON text a tool.call span
    carries, made once per tool: the tools are the operator's, few, and called again and again."""

    _MAX_CHARS = 8192

    def __init__(self) -> None:
        self._rendered: dict[str, tuple[object, str]] = {}  # by name: the schema rendered, and its text

    def of(self, tool: Tool) -> str:
        schema = tool.declared_schema
        found = self._rendered.get(tool.name)
        if found is not None and found[0] is schema:  # the same declaration (an MCP tool may be redeclared)
            return found[1]
        text = bounded(json.dumps(schema, ensure_ascii=False, default=str), self._MAX_CHARS)
        self._rendered[tool.name] = schema, text
        return text


class NameLabels:
    """Names a caller declares (its own tools' names) as metric labels: the first `limit` distinct
    ones of at most `max_chars` characters, then `other` for the rest."""

    def __init__(self, limit: int, max_chars: int, other: str) -> None:
        self._seen: set[str] = set()
        self._limit = limit
        self._max_chars = max_chars
        self._other = other

    def label(self, name: str) -> str:
        if name in self._seen:
            return name
        if len(self._seen) >= self._limit or len(name) > self._max_chars or name == self._other:
            return self._other
        self._seen.add(name)
        return name
