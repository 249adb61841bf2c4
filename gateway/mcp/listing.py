"""What an MCP server lists, made the registry's tools: a `tools/list` answer screened tool by tool
before the client reads it (so that one unusable tool is left out, not the whole list), and the
tools built again only where their definition changed, yielding to the event loop between builds
(building one checks its schema against the JSON Schema metaschema, which takes a while)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import mcp_types
from mcp.shared.message import SessionMessage
from mcp_types import methods
from mcp_types.jsonrpc import JSONRPCResponse
from pydantic import BaseModel, ValidationError

from gateway.tools import Tool, ToolDeclarationError

log = logging.getLogger("toolspan.mcp")
_LIST_TOOLS = "tools/list"


class ListingWarnings:
    """What one server's listings leave out, logged as a warning when it first appears and not
    again while each listing since has said it (a server announcing changes every second would
    otherwise repeat the same words every second)."""

    def __init__(self, server: str) -> None:
        self._server = server
        self._before: set[str] = set()  # said by the last listing
        self._now: set[str] = set()  # said by the listing under way

    def warn(self, text: str) -> None:
        if text not in self._before and text not in self._now:
            log.warning("MCP server %r: %s", self._server, text)
        self._now.add(text)

    def listed(self) -> None:
        """A listing is over: what it said is what the next one need not say again."""
        self._before, self._now = self._now, set()


def screened_message(item: Any, version: str | None, warnings: ListingWarnings, most: int) -> Any:
    """`item` as read from a server's transport; for a `tools/list` answer, `screened`. An answer is
    taken for one by its shape (a result holding a list of `tools`: no other MCP result has it)."""
    message = item.message if isinstance(item, SessionMessage) else None
    if version is None or not isinstance(message, JSONRPCResponse) or not isinstance(message.result.get("tools"), list):
        return item
    result = screened(message.result, version, warnings, most)
    if result is message.result:
        return item
    return SessionMessage(message.model_copy(update={"result": result}), metadata=item.metadata)


def screened(result: dict[str, Any], version: str, warnings: ListingWarnings, most: int) -> dict[str, Any]:
    """A `tools/list` result cut to its first `most` tools (the client then reads no more than the
    gateway can take), without those the protocol's schema (of `version`) refuses, each named in a
    warning with the reason. A result that is wrong outside its tools is left as it is, for the
    client to refuse."""
    surface = methods.SERVER_RESULTS.get((_LIST_TOOLS, version))
    if not (isinstance(surface, type) and issubclass(surface, BaseModel)):
        return result  # a protocol version whose schema is not known here: the client decides
    if len(result["tools"]) > most:
        result = {**result, "tools": result["tools"][:most]}
    if _refusal(surface, result) is None or _refusal(surface, {**result, "tools": []}) is not None:
        return result
    kept = []
    for index, tool in enumerate(result["tools"]):
        why = _refusal(surface, {**result, "tools": [tool]})
        if why is None:
            kept.append(tool)
            continue
        name = tool.get("name") if isinstance(tool, dict) else None
        label = repr(name) if isinstance(name, str) else f"number {index + 1} (it has no name)"
        warnings.warn(f"tool {label} left out: {why}")
    return {**result, "tools": kept}


def _refusal(surface: type[BaseModel], result: dict[str, Any]) -> str | None:
    """Why the schema refuses `result` (its first error), or None."""
    try:
        surface.model_validate(result, by_name=False)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"][2:])  # past ("tools", 0)
        return f"{where}: {error['msg']}" if where else str(error["msg"])
    return None


class BuiltTools:
    """The registry Tools of one server's listed tools, kept with the definitions they were built
    from, so that a listing builds only the tools that are new or changed."""

    def __init__(self, build: Callable[[mcp_types.Tool], Tool], warnings: ListingWarnings) -> None:
        self._build = build
        self._warnings = warnings
        self._built: dict[str, tuple[mcp_types.Tool, Tool]] = {}

    async def update(self, listed: list[mcp_types.Tool]) -> list[Tool]:
        """The Tools of `listed`, in its order; those that cannot be built are left out with a
        warning. The event loop runs between two builds."""
        built: dict[str, tuple[mcp_types.Tool, Tool]] = {}
        tools = []
        for item in listed:
            previous = self._built.get(item.name)
            if previous is not None and previous[0] == item:
                tool = previous[1]
            else:
                await asyncio.sleep(0)
                try:
                    tool = self._build(item)
                except ToolDeclarationError as exc:
                    self._warnings.warn(f"tool {item.name!r} left out: {exc}")
                    continue
            built.setdefault(item.name, (item, tool))
            tools.append(tool)
        self._built = built
        return tools
