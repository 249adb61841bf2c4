"""Argument repair, opt-in (`argument_repair`: off, observe, apply): a call the parse step refused is
mended when the fix is sure, and only then.

What is mended, at the top level of the arguments, against the schema the tool declares:
- a name the tool does not take, when exactly one parameter not sent fits it (`fitting_names`,
  at REPAIR_SIMILARITY) and no other unknown name fits that parameter: renamed;
- a string holding an integer, a number or a boolean (`"12"`, `"2.5"`, `"true"`) where the schema
  wants that type: the value, of that type;
- a bare value where the schema wants an array of its type: an array of that one value.
Never a guess between two names, never a value changed beyond its type. The mended arguments must
fit the declared schema (checked within the inline budget) and pass the tool's own parse step;
otherwise nothing is mended. `observe` records the fix and leaves the call rejected; `apply` runs the
tool on the mended arguments, and the call's outcome is `repaired`."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from typing import Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import UndefinedTypeCheck
from jsonschema.protocols import Validator

from gateway.tools.aliases import clashing, unaliased
from gateway.tools.arguments import read_arguments
from gateway.tools.function import Tool
from gateway.tools.params import MAX_NAME_CHARS, MAX_NAMES_SHOWN, check_names, fitting_names, name_words
from gateway.tools.results import Parsed, Rejection, Repair, ToolContext
from gateway.tools.schema import closed_to_other_names, value_problems
from gateway.tools.schema_bounds import INLINE, OverBudget, Skipped, metered
from gateway.tools.strict_nulls import drop_optional_nulls

RepairMode = Literal["off", "observe", "apply"]
# Words that change what a value measures: units, bounds and quantities. A rename that adds or drops
# one is no respelling (`timeout` is not `timeout_ms`, `price` is not `max_price`, `page` is not
# `page_length`).
MEASURE_WORDS = frozenset({
    "ms", "msec", "millis", "milliseconds", "us", "ns", "s", "sec", "secs", "second", "seconds", "min", "mins",
    "minute", "minutes", "h", "hr", "hrs", "hour", "hours", "day", "days", "week", "weeks", "bytes", "kb",
    "kib", "mb", "mib", "gb", "gib", "pct", "percent", "px", "mm", "cm", "m", "km", "kg", "g", "usd", "cents",
    "max", "maximum", "minimum", "limit", "start", "end", "from", "to", "before", "after", "since", "until",
    "size", "length", "count", "number", "num", "total", "index", "offset"})
REPAIR_SIMILARITY = 0.9  # the Jaro similarity over which a name fits, for a rename (suggestions take 0.7)
REPAIRABLE = frozenset({"missing_arguments", "schema_violation", "parser"})  # rejections of the arguments' shape
_INTEGER = re.compile(r"-?(?:0|[1-9][0-9]{0,17})")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]{0,17})(?:\.[0-9]{1,17})?(?:[eE][+-]?[0-9]{1,3})?")
_BOOLEANS = {"true": True, "false": False}
_TYPES = Draft202012Validator.TYPE_CHECKER  # JSON Schema's types (a boolean is no integer; 2.0 is one)


@dataclass(frozen=True)
class RepairPolicy:
    """The mode of a call's repair: its caller's key's, else its tool's own (Tool.argument_repair), else
    the first pattern of `by_tool` that names the tool (tool_argument_repair), else `default`."""

    default: RepairMode
    by_tool: tuple[tuple[str, RepairMode], ...] = ()
    by_key: Mapping[str, RepairMode] = field(default_factory=dict)

    def mode(self, tool: Tool, principal: str | None) -> RepairMode:
        if principal is not None and (chosen := self.by_key.get(principal)) is not None:
            return chosen
        if tool.argument_repair is not None:
            return tool.argument_repair
        for pattern, chosen in self.by_tool:
            if fnmatchcase(tool.name, pattern):
                return chosen
        return self.default

    @classmethod
    def configured(cls, default: RepairMode, by_tool: Mapping[str, RepairMode], by_key: Mapping[str, RepairMode],
                   tools: list[Tool]) -> RepairPolicy | None:
        """The policy, or None when nothing asks for repair: then a rejected call spends nothing on it.
        (A tool registered later, an MCP server's, has no argument_repair of its own.)"""
        modes = [default, *by_tool.values(), *by_key.values(), *(t.argument_repair for t in tools)]
        if all(mode in (None, "off") for mode in modes):
            return None
        return cls(default, tuple(by_tool.items()), dict(by_key))


async def repaired(tool: Tool, raw: Any, rejection: Rejection, context: ToolContext,
                   applied: bool) -> tuple[Repair, Parsed] | None:
    """The sure fix of arguments the parse step refused, and their parse; None when there is none."""
    if rejection.reason not in REPAIRABLE:
        return None
    properties = tool.declared_schema.get("properties")
    decoded = read_arguments(tool.name, raw)
    if not isinstance(properties, Mapping) or not properties or isinstance(decoded, Rejection):
        return None
    if clashing(decoded, tool.alias_of):
        return None  # a parameter sent under two of its names: which value was meant is the model's to say
    unaliased_args, aliases = unaliased(decoded, tool.alias_of)  # the aliases are the call's, recorded apart
    renamable = tool.required_names if not closed_to_other_names(tool.declared_schema) else tuple(properties)
    after, changes = _renamed(unaliased_args, list(properties), renamable)
    after, retyped = _retyped(after, properties)
    changes += retyped
    if not changes or not _fits_schema(tool, after, await tool.declared_validator_built()):
        return None
    parsed = await tool.parse_arguments(after, context)
    if isinstance(parsed, Rejection):
        return None
    return Repair(dict(decoded), after, tuple(changes), applied), replace(parsed, aliases=aliases)


def _renamed(args: dict[str, Any], accepted: list[str], renamable: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """Each unknown name renamed to the one parameter not sent that fits it (and that no other
    unknown name fits), when that parameter is one a rename may give: a required one, or any when the
    schema refuses other names (else the name was a harmless extra, and a rename would change what
    the call means). A call of more unknown names than the tool has parameters (or than a
    diagnostic shows), or of a name longer than a parameter's may be, gets none: comparing them all
    would cost the event loop in proportion to what the model sent, and no rename of such a call is sure."""
    unknown = [name for name in args if name not in accepted]
    if len(unknown) > min(len(accepted), MAX_NAMES_SHOWN) or any(len(name) > MAX_NAME_CHARS for name in unknown):
        return args, []  # more invented names than parameters, or a name no parameter's could be: no sure rename
    unsent = [name for name in accepted if name not in args]
    fits = {name: fitting_names(name, unsent, REPAIR_SIMILARITY) for name in unknown}
    renames: dict[str, str] = {}
    for name, fitting in fits.items():
        if len(fitting) != 1 or sum(fitting[0] in others for others in fits.values()) != 1:
            continue  # none fits, or a guess between several (`acc_routing`: its `_start` or its `_update`?)
        if fitting[0] in renamable and _same_measure(name, fitting[0]):
            renames[name] = fitting[0]
    after = {renames.get(name, name): value for name, value in args.items()}
    return after, [f"rename {sent} -> {meant}" for sent, meant in renames.items()]


def _same_measure(sent: str, meant: str) -> bool:
    """Whether the words one name has and the other lacks leave the value's meaning alone: not a unit
    (`timeout` for `timeout_ms`: seconds read as milliseconds) nor a bound (`price` for `max_price`)."""
    return not (set(name_words(sent)) ^ set(name_words(meant))) & MEASURE_WORDS


def _retyped(args: dict[str, Any], properties: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    after, changes = dict(args), []
    for name, value in args.items():
        wanted = properties.get(name)
        if not isinstance(wanted, Mapping) or not isinstance(kind := wanted.get("type"), str) or _is_type(value, kind):
            continue
        if isinstance(value, str) and (typed := _typed(value, kind)) is not None:
            after[name] = typed
            changes.append(f"type {name}: string -> {kind}")
        elif kind == "array" and value is not None and _is_item(value, wanted.get("items")) and not _listing(value):
            after[name] = [value]
            changes.append(f"wrap {name} in an array")
    return after, changes


def _is_type(value: Any, kind: str) -> bool:
    """Whether `value` is of the JSON Schema type `kind` (any value, of a type it does not know)."""
    try:
        return bool(_TYPES.is_type(value, kind))
    except UndefinedTypeCheck:
        return True


def _typed(text: str, kind: str) -> Any:
    """`text` as a value of `kind`, when it spells exactly one; else None."""
    if kind == "integer" and _INTEGER.fullmatch(text):
        return int(text)
    if kind == "number" and _NUMBER.fullmatch(text):
        number = float(text)
        return int(text) if _INTEGER.fullmatch(text) else (number if math.isfinite(number) else None)
    if kind == "boolean":
        return _BOOLEANS.get(text)
    return None


def _listing(value: Any) -> bool:
    """A string that may hold several items (`"a, b"`, `'["a", "b"]'`): wrapped whole, it would be a
    guess at the list the model meant."""
    return isinstance(value, str) and ("," in value or value.lstrip().startswith("["))


def _is_item(value: Any, items: Any) -> bool:
    """Whether `value` is of the array's item type (any, when the schema names none)."""
    kind = items.get("type") if isinstance(items, Mapping) else None
    if kind is None:
        return not isinstance(value, list | dict)
    return isinstance(kind, str) and _is_type(value, kind)


def _fits_schema(tool: Tool, args: dict[str, Any], validator: Validator | Skipped) -> bool:
    """Whether `args` fit the schema the tool declares, checked within the inline budget with the
    tool's validator (built once: compiling it here, within that budget, would make a busy machine
    mend less); a schema that cannot be checked at a bounded cost, or is no JSON Schema, mends
    nothing."""
    if isinstance(validator, str):
        return False
    if tool.strict:  # a strict model's null for an optional parameter means "not sent", as the parse step reads it
        args = drop_optional_nulls(args, tool.declared_schema)
    check = check_names(args, tool.required_names, tool.accepted_names)
    with metered(INLINE):
        try:
            return not value_problems(validator, args, check) and not check.missing
        except OverBudget:
            return False
