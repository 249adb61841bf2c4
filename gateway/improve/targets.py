"""What recorded calls are replayed against (gateway.improve.replay): tools, as a registry holds
them or a module declares them, or the JSON schemas a file declares, checked as the gateway checks
the calls of a client's own tools (gateway.client_tools.check).

A schema file is data, like a client's `tools`: it is read, never followed (its references stay
inside it), and each check of a call against it spends from a bounded budget; a schema past the
bounds leaves its calls `unchecked`. The file holds a JSON list of tool declarations in the shape
of any API (Chat Completions' `{"type": "function", "function": {"name", "parameters"}}`, the
Responses API's `{"type": "function", "name", "parameters"}`, Anthropic's `{"name",
"input_schema"}`), a request body with such a `tools` list, or an object of tool names to the JSON
Schema of their arguments."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from gateway.client_tools.check import ClientTools, SchemaCache
from gateway.improve.replay import RecordedCall, Verdict
from gateway.settings.model import Settings
from gateway.settings.parts import GatewayKey
from gateway.tools import Rejection, Tool, ToolContext, ToolRegistry
from gateway.tools.repair import RepairPolicy, repaired

MAX_FILE_BYTES = 16 * 1024 * 1024  # a schema file past this is refused before it is read
_SHAPES = ("a JSON list of tool declarations (Chat Completions, Responses or Anthropic Messages shape), "
           "a request body with such a \"tools\" list, or an object of tool names to JSON Schemas")


class ToolsTarget:
    """Tools as the gateway would run them: each call's parse step is the tool's own
    (`Tool.parse_arguments`, its aliases included), with the context the gateway gave it but for the
    request's metadata, which the store does not keep; arguments it refuses are repaired where
    `repair` applies to the tool and the call's key, as the executor does. Arguments whose values
    the parse step could not check (Parsed.unchecked: a schema past the bounds of a check, or a
    check past its budget) are unchecked, not a pass: the gateway ran them on their names alone. The client's tools have
    no schema here. `allowed`: the tools each gateway key (by name) may use, where it may not use
    every one; a call of a tool its key may not use is one of a tool not in the target, as that
    key sees it."""

    def __init__(self, tools: Iterable[Tool], description: str,
                 allowed: Mapping[str, frozenset[str]] | None = None, repair: RepairPolicy | None = None) -> None:
        self.tools = {tool.name: tool for tool in tools}
        self.description = description
        self.allowed = dict(allowed or {})
        self.repair = repair

    def covers(self, call: RecordedCall) -> Literal["no_schema", "not_in_target"] | None:
        if call.side != "gateway":
            return "no_schema"
        allowed = self.allowed.get(call.key) if call.key is not None else None
        return None if call.tool in self.tools and (allowed is None or call.tool in allowed) else "not_in_target"

    async def parse(self, call: RecordedCall) -> Verdict | None:
        context = ToolContext(tool_call_id=call.call_id or call.span_id, trajectory_id=call.local_id,
                              principal=call.key)
        tool = self.tools[call.tool]
        parsed = await tool.parse_arguments(call.arguments, context)
        if not isinstance(parsed, Rejection):  # values it could not check (Parsed.unchecked) pass no check
            return Verdict(True) if parsed.unchecked is None else None
        applies = self.repair is not None and self.repair.mode(tool, call.key) == "apply"
        mended = await repaired(tool, call.arguments, parsed, context, True) if applies else None
        if mended is not None:
            return Verdict(True, repaired=True) if mended[1].unchecked is None else None
        return Verdict(False, parsed.reason, parsed.message)


def as_served(registry: ToolRegistry, description: str, settings: Settings) -> ToolsTarget:
    """`registry`'s tools as a gateway with `settings` would run them: with the operator's aliases
    (tool_aliases; one that fits no parameter is a ToolDeclarationError, as at start-up) and the
    argument repair configured (argument_repair, tool_argument_repair and the keys'), each key's
    calls against the tools it may use (its `tools`), as the page replays them."""
    registry.use_aliases(settings.tool_aliases)
    by_key = {name: key.argument_repair for name, key in settings.keys.items() if key.argument_repair is not None}
    repair = RepairPolicy.configured(settings.argument_repair, settings.tool_argument_repair, by_key, list(registry))
    return ToolsTarget(registry, description, allowlists(settings.keys), repair)


def allowlists(keys: Mapping[str, GatewayKey]) -> dict[str, frozenset[str]]:
    """The tools each gateway key (by name) may use, of the keys that may not use every one."""
    return {name: frozenset(key.tools) for name, key in keys.items() if key.tools is not None}


class SchemaTarget:
    """Declared schemas: every call of a tool the file declares, the gateway's or the client's, is
    checked as a client's call is (gateway.client_tools.check.ClientTools)."""

    def __init__(self, declarations: list[dict[str, Any]], description: str) -> None:
        self.checks = ClientTools(declarations, SchemaCache())
        self.names = frozenset(self.checks.names)
        self.description = description

    def covers(self, call: RecordedCall) -> Literal["no_schema", "not_in_target"] | None:
        return None if call.tool in self.names else "not_in_target"

    async def parse(self, call: RecordedCall) -> Verdict | None:
        checked = self.checks.check(call.tool, call.arguments)  # within its bounded budget, on this thread
        if checked.rejection is not None:
            return Verdict(False, checked.rejection.reason, checked.rejection.message)
        return None if checked.outcome == "unchecked" else Verdict(True)


def schema_file(path: Path) -> SchemaTarget:
    """The tool schemas a file declares; a file that cannot be read or is not of one of the shapes
    is a ValueError, said in one line."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ValueError(f"--against {path}: over {MAX_FILE_BYTES // (1024 * 1024)} MiB; a schema file is "
                             "smaller")
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"--against {path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ValueError(f"--against {path}: not UTF-8 text; expected {_SHAPES}") from None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"--against {path}: not JSON ({str(exc).splitlines()[0]}); expected {_SHAPES}") from None
    declarations = declared_tools(value, f"--against {path}")
    return SchemaTarget(declarations, f"the schemas of {path} ({len(declarations)} tools)")


def declared_tools(value: Any, where: str) -> list[dict[str, Any]]:
    """The tool declarations `value` (a schema file's JSON) holds, as a request's `tools` would
    hold them; what is wrong with it, as a ValueError that starts with `where`."""
    if isinstance(value, dict) and isinstance(value.get("tools"), list):
        value = value["tools"]
    if isinstance(value, dict):
        return [_as_chat(name, schema, where) for name, schema in value.items()]
    if not isinstance(value, list):
        raise ValueError(f"{where}: a JSON {type(value).__name__}; expected {_SHAPES}")
    for index, item in enumerate(value):
        if _tool_name(item) is None:
            raise ValueError(f"{where}: item {index} declares no tool (no name where Chat Completions, Responses "
                             "or Anthropic Messages put one)")
    if not value:
        raise ValueError(f"{where}: declares no tools; expected {_SHAPES}")
    return value


def _as_chat(name: str, schema: Any, where: str) -> dict[str, Any]:
    if not isinstance(schema, dict):
        raise ValueError(f"{where}: the schema of {name!r} is a JSON {type(schema).__name__}, not an object")
    return {"type": "function", "function": {"name": name, "parameters": schema}}


def _tool_name(item: Any) -> str | None:
    """A declaration's name, where each API puts it; None when it has none."""
    if not isinstance(item, dict):
        return None
    inner = item.get("function")
    name = inner.get("name") if item.get("type") == "function" and isinstance(inner, dict) else item.get("name")
    return name if isinstance(name, str) and name else None
