"""ToolRegistry: the tools the gateway offers, by name."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from gateway.tools.aliases import alias_table, merged
from gateway.tools.function import Tool
from gateway.tools.params import ToolDeclarationError

log = logging.getLogger("toolspan")


class ToolRegistry:
    """Tools by name, in registration order. A name can be registered once. `guardrails` apply
    to the calls of every tool registered here (gateway.guardrails).

    A source (an MCP server) may replace its own tools while requests are served: every change
    puts a new dict in place rather than changing the one a request may be iterating, and starts
    new spec caches."""

    def __init__(self, tools: Iterable[Tool] = (), guardrails: Sequence[Any] = ()) -> None:
        # guardrails of every tool registered here, before each tool's own (gateway.guardrails)
        self.guardrails = tuple(guardrails)
        self._tools: dict[str, Tool] = {}
        self._sources: dict[str, str] = {}  # tool name -> the source that registered it
        self._request_sources: frozenset[str] = frozenset()  # sources whose tools only a request's declaration offers
        self._on_request: frozenset[str] = frozenset()  # the names of those sources' tools
        # Specs and names by allowlist, built once: every request offers them. Any change drops them.
        self._specs: dict[tuple[str, frozenset[str] | None], list[dict[str, Any]]] = {}
        self._names: dict[frozenset[str] | None, frozenset[str]] = {}
        self._operator_aliases: dict[str, dict[str, list[str]]] = {}  # the setting tool_aliases, by tool
        self._refused_aliases: set[tuple[str, str, str]] = set()  # (tool, parameter, alias) warned of once
        for item in tools:
            self.register(item)

    def register(self, tool: Tool) -> Tool:
        """Add `tool`; returns it, so this also works as a decorator on `@tool` results."""
        if not isinstance(tool, Tool):
            raise ToolDeclarationError(f"only Tool objects can be registered, not {type(tool).__name__}")
        if tool.name in self._tools:
            raise ToolDeclarationError(f"tool {tool.name!r} is already registered")
        self._swap({**self._tools, tool.name: tool})
        return tool

    def replace_source(self, source: str, tools: Iterable[Tool], on_request: bool = False) -> list[str]:
        """Make `tools` the whole set of `source`'s tools (none: it has no tools now). Returns the
        names it could not take because a tool of another origin already has them. `on_request`: the
        source's tools are kept (and run) like any, but never offered to every caller: a request
        offers them when it declares their source (gateway.mcp.declared)."""
        if on_request:
            self._request_sources |= {source}
        kept = {name: t for name, t in self._tools.items() if self._sources.get(name) != source}
        sources = {name: s for name, s in self._sources.items() if s != source}
        refused = []
        for item in tools:
            if item.name in kept:
                refused.append(item.name)
                continue
            kept[item.name] = item
            sources[item.name] = source
        self._sources = sources
        self._swap(kept)
        return refused

    def source_of(self, name: str) -> str | None:
        """The source that registered tool `name`; None for a tool registered by itself."""
        return self._sources.get(name)

    def on_request(self, name: str) -> bool:
        """Tool `name` is offered only to the requests that declare its source."""
        return name in self._on_request

    def tools_of(self, source: str) -> list[Tool]:
        """The tools `source` registered, in registration order."""
        return [tool for name, tool in self._tools.items() if self._sources.get(name) == source]

    def use_aliases(self, table: Mapping[str, Mapping[str, Sequence[str]]]) -> None:
        """The operator's aliases (the setting `tool_aliases`: tool -> parameter -> names), added to
        the tools registered now and to those registered later (an MCP server's, as it lists them).
        An alias that does not fit a tool registered now fails here (ToolDeclarationError); one that
        does not fit a tool a server lists later is left out of that tool."""
        self._operator_aliases = {tool: {name: list(names) for name, names in params.items()}
                                  for tool, params in table.items()}
        self._swap({name: self._aliased(tool) for name, tool in self._tools.items()})

    def _aliased(self, tool: Tool) -> Tool:
        extra = self._operator_aliases.get(tool.name)
        if not extra or all(set(names) <= set(tool.aliases.get(name, ())) for name, names in extra.items()):
            return tool
        return replace(tool, aliases=merged(tool.aliases, extra))

    def _swap(self, tools: dict[str, Tool]) -> None:
        if self._operator_aliases:
            tools = {name: self._kept_aliased(tool) for name, tool in tools.items()}
        self._tools = tools
        self._on_request = frozenset(name for name in tools if self._sources.get(name) in self._request_sources)
        self._specs = {}
        self._names = {}

    def _kept_aliased(self, tool: Tool) -> Tool:
        """`tool` with the operator's aliases that fit it; each that does not (a server listed a tool
        whose parameters differ from what the table expects) is left out, with a warning once."""
        try:
            return self._aliased(tool)
        except ToolDeclarationError:
            pass
        kept: dict[str, list[str]] = {}
        for name, names in self._operator_aliases.get(tool.name, {}).items():
            for alias in names:
                trial = merged(kept, {name: [alias]})
                try:
                    alias_table(tool.name, merged(tool.aliases, trial), tool.accepted_names)
                except ToolDeclarationError as exc:
                    if (tool.name, name, alias) not in self._refused_aliases:
                        self._refused_aliases.add((tool.name, name, alias))
                        log.warning("tool_aliases: %s; left out", exc)
                    continue
                kept = trial
        return replace(tool, aliases=merged(tool.aliases, kept)) if kept else tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        """Every registered name, those offered only on request included."""
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

    def approval_names(self, allowed: frozenset[str] | None = None) -> frozenset[str]:
        """The names of the tools, of those a caller with this allowlist is offered, whose calls
        wait for a reviewer's approval."""
        return frozenset(t.name for t in self._select(allowed) if t.approval)

    def _select(self, allowed: Collection[str] | None) -> list[Tool]:
        hidden = self._on_request
        return [t for t in self._tools.values() if t.name not in hidden and (allowed is None or t.name in allowed)]

    def specs(self, shape: str, make: Callable[[Tool], dict[str, Any]],
              allowed: Collection[str] | None = None) -> list[dict[str, Any]]:
        """The tools (optionally only the `allowed` names) as a wire API declares them: `make` of
        each, made once per `shape` and allowlist."""
        key = (shape, None if allowed is None else frozenset(allowed))
        specs = self._specs.get(key)
        if specs is None:
            specs = self._specs[key] = [make(t) for t in self._select(allowed)]
        return list(specs)  # a fresh list; the spec dicts inside are shared and must not be changed
