"""ToolRegistry: the tools the gateway offers, by name."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from typing import Any

from gateway.tools.function import Tool
from gateway.tools.params import ToolDeclarationError


class ToolRegistry:
    """Tools by name, in registration order. A name can be registered once."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        # Specs and names by allowlist, built once: every request offers them. Registering clears them.
        self._specs: dict[tuple[str, frozenset[str] | None], list[dict[str, Any]]] = {}
        self._names: dict[frozenset[str] | None, frozenset[str]] = {}
        for item in tools:
            self.register(item)

    def register(self, tool: Tool) -> Tool:
        """Add `tool`; returns it, so this also works as a decorator on `@tool` results."""
        if not isinstance(tool, Tool):
            raise ToolDeclarationError(f"only Tool objects can be registered, not {type(tool).__name__}")
        if tool.name in self._tools:
            raise ToolDeclarationError(f"tool {tool.name!r} is already registered")
        self._tools[tool.name] = tool
        self._specs.clear()
        self._names.clear()
        return tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, item: object) -> bool:
        """By name; a Tool is contained when that very tool is registered (Tools are not hashable)."""
        if isinstance(item, Tool):
            return self._tools.get(item.name) is item
        return isinstance(item, str) and item in self._tools

    def offered_names(self, allowed: frozenset[str] | None = None) -> frozenset[str]:
        """The names of the tools a caller with this allowlist is offered."""
        found = self._names.get(allowed)
        if found is None:
            found = self._names[allowed] = frozenset(t.name for t in self._select(allowed))
        return found

    def _select(self, allowed: Collection[str] | None) -> list[Tool]:
        return [t for t in self._tools.values() if allowed is None or t.name in allowed]

    def _specs_of(self, shape: str, allowed: Collection[str] | None) -> list[dict[str, Any]]:
        key = (shape, None if allowed is None else frozenset(allowed))
        specs = self._specs.get(key)
        if specs is None:
            tools = self._select(allowed)
            specs = self._specs[key] = [t.openai_spec() if shape == "chat" else t.responses_spec() for t in tools]
        return list(specs)  # a fresh list; the spec dicts inside are shared and must not be changed

    def openai_tools(self, allowed: Collection[str] | None = None) -> list[dict[str, Any]]:
        """Chat Completions `tools` entries (optionally only the `allowed` names)."""
        return self._specs_of("chat", allowed)

    def responses_tools(self, allowed: Collection[str] | None = None) -> list[dict[str, Any]]:
        """Responses API `tools` entries (flat shape)."""
        return self._specs_of("responses", allowed)
