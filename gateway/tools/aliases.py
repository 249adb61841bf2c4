"""Parameter aliases: other names a tool accepts for a parameter, quietly, because models keep
sending them (`file_path` for `path`). Declared on a Param (`aliases=`), through `Annotated[str,
Alias("file_path")]` on an `@tool` function or an args_model's field, in `Tool(aliases=...)`, or
by the operator (the setting `tool_aliases`, gateway.tools.registry). An alias is renamed to its
parameter before the parse step checks anything, and the call records which it used, so the
operator sees how often each is needed (toolspan_tool_aliases_used_total)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from gateway.tools.params import MAX_NAME_CHARS, Param, ToolDeclarationError

AliasUse = tuple[str, str]  # (the alias sent, the parameter it stands for)


class Alias:
    """`Annotated[str, Alias("file_path", "filepath")]`: names the parameter is also accepted under."""

    __slots__ = ("names",)

    def __init__(self, *names: str) -> None:
        self.names = names

    def __repr__(self) -> str:
        return f"Alias({', '.join(map(repr, self.names))})"


def declared_aliases(parameters: Sequence[Param] | None, args_model: type[BaseModel] | None,
                     explicit: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """Every alias a tool declares, by parameter: its Params' (top level), its args_model fields'
    Alias annotations, then `explicit` (Tool(aliases=...), the operator's table)."""
    found: dict[str, list[str]] = {}
    for param in parameters or ():
        found.setdefault(param.name, []).extend(param.aliases)
    if args_model is not None:
        for name, info in args_model.model_fields.items():
            for item in info.metadata:
                if isinstance(item, Alias):
                    found.setdefault(name, []).extend(item.names)
    for name, names in explicit.items():
        found.setdefault(name, []).extend([names] if isinstance(names, str) else names)
    return {name: list(dict.fromkeys(names)) for name, names in found.items() if names}


def alias_table(tool: str, aliases: Mapping[str, Sequence[str]], accepted: Sequence[str]) -> dict[str, str]:
    """alias -> parameter, checked: each alias a name of its own (not a parameter's, not another
    alias's), of a parameter the tool declares (when it lists its parameters)."""
    table: dict[str, str] = {}
    for name, names in aliases.items():
        if accepted and name not in accepted:
            raise ToolDeclarationError(f"tool {tool!r}: aliases for {name!r}, which is not one of its parameters "
                                       f"({', '.join(accepted)})")
        for alias in names:
            if not isinstance(alias, str) or not 0 < len(alias) <= MAX_NAME_CHARS:
                raise ToolDeclarationError(f"tool {tool!r}: alias {alias!r} of {name!r} is not a name of 1 to 64 "
                                           "characters")
            if alias in accepted or alias == name:
                raise ToolDeclarationError(f"tool {tool!r}: alias {alias!r} is a parameter's own name")
            if table.setdefault(alias, name) != name:
                raise ToolDeclarationError(f"tool {tool!r}: alias {alias!r} stands for both {table[alias]!r} "
                                           f"and {name!r}")
    return table


def unaliased(args: dict[str, Any], table: Mapping[str, str]) -> tuple[dict[str, Any], tuple[AliasUse, ...]]:
    """`args` with each alias sent renamed to its parameter, and the aliases used. (A parameter sent
    under two of its names is `clashing`'s to refuse: the parse step checks that first.)"""
    if not table or not any(name in table for name in args):
        return args, ()
    renamed: dict[str, Any] = {}
    used: list[AliasUse] = []
    for name, value in args.items():
        target = table.get(name)
        if target is not None and target not in args and target not in renamed:
            renamed[target] = value
            used.append((name, target))
        else:
            renamed[name] = value
    return renamed, tuple(used)


def clashing(args: Mapping[str, Any], table: Mapping[str, str]) -> dict[str, list[str]]:
    """The parameters `args` sends under more than one of their names (`path` and its alias
    `file_path`), with those names: which value was meant is the model's to say."""
    if not table or not any(name in table for name in args):
        return {}
    names: dict[str, list[str]] = {}
    for name in args:
        names.setdefault(table.get(name, name), []).append(name)
    return {parameter: sent for parameter, sent in names.items() if len(sent) > 1}


def merged(first: Mapping[str, Sequence[str]], more: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
    """Two alias declarations as one, by parameter, each alias once."""
    out = {name: list(names) for name, names in first.items()}
    for name, names in more.items():
        out[name] = list(dict.fromkeys([*out.get(name, []), *names]))
    return out
