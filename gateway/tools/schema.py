"""The parse step's check of argument values against a tool's own JSON schema (MCP tools ask for
it, and the check of the client's own tools makes it): every problem in one message, in the words
of the other argument diagnostics. The schema is a third party's, so it is used within the bounds of
gateway.tools.schema_bounds: nothing fetched, no regular expression run, the work metered."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jsonschema import (
    Draft3Validator,
    Draft4Validator,
    Draft6Validator,
    Draft7Validator,
    Draft201909Validator,
    Draft202012Validator,
    validators,
)
from jsonschema.protocols import Validator
from referencing import Registry, Specification
from referencing.jsonschema import specification_with

from gateway.tools.params import NameCheck, ToolDeclarationError, describe_names, name_lines
from gateway.tools.schema_bounds import (
    OFF_LOOP,
    Budget,
    OverBudget,
    Skipped,
    first_message,
    local_registry,
    metaschema_registry,
    metered,
    metered_keywords,
    survey,
)

MAX_PROBLEMS = 20  # a model can send thousands of bad values; the message names the first few
_PROBLEM_CHARS = 200


def schema_validator(tool: str, schema: Mapping[str, Any]) -> Validator | Skipped:
    """A validator for `schema` (by its `$schema`, draft 2020-12 when it names none), or why values
    are not checked against it (gateway.tools.schema_bounds: a reference leading outside it, too
    much work, a reference to nowhere in it). A schema that is not valid JSON Schema fails here,
    when the tool is built. The work spends from the budget of the check under way: past it,
    OverBudget."""
    dialect = schema.get("$schema")
    if dialect is not None and not isinstance(dialect, str):
        raise ToolDeclarationError(f"tool {tool!r}: its parameters schema is not valid JSON Schema "
                                   "($schema is not a string)")
    cls = validators.validator_for(schema, default=Draft202012Validator)
    kind = _KINDS.get(cls) or _Kind.of(cls, metaschema_registry())
    problem = first_message(kind.metaschema.iter_errors(schema))
    if problem is not None:
        raise ToolDeclarationError(f"tool {tool!r}: its parameters schema is not valid JSON Schema "
                                   f"({_shortened(problem)})")
    registry = local_registry(schema, kind.specification)
    skipped = survey(schema, kind.specification, registry)
    if skipped is not None:
        return skipped
    validator: Validator = kind.bounded(schema, registry=registry)
    return validator


def bounded_validator(tool: str, schema: Mapping[str, Any], budget: Budget = OFF_LOOP) -> Validator | Skipped:
    """schema_validator within `budget`, `too_complex` past it: for a tool built once (an MCP
    server's, when it is listed), with the budget a check off the event loop has."""
    with metered(budget):
        try:
            return schema_validator(tool, schema)
        except OverBudget:
            return "too_complex"


def _unchecked(validator: Validator, value: Any, instance: Any, schema: Mapping[str, Any]) -> None:
    return None


@dataclass(frozen=True)
class _Kind:
    """What checking with one draft takes: the validator class used on values, bounded; the
    metaschema check, bounded the same way; the referencing rules of the draft."""

    bounded: type[Validator]
    metaschema: Validator
    specification: Specification[Any]

    @classmethod
    def of(cls, draft: type[Validator], metaschemas: Registry[Any]) -> _Kind:
        checking = validators.validator_for(draft.META_SCHEMA, default=draft)
        metaschema_class = validators.extend(checking, metered_keywords(checking.VALIDATORS))
        stripped = {key: value for key, value in draft.META_SCHEMA.items() if key != "$schema"}
        return cls(_bounded(draft), metaschema_class(stripped, registry=metaschemas,
                                                     format_checker=checking.FORMAT_CHECKER),
                   specification_with(draft.ID_OF(draft.META_SCHEMA) or "urn:unknown-dialect",
                                      default=Specification.OPAQUE))


def _bounded(cls: type[Validator]) -> type[Validator]:
    """`cls` checking no regular expression, and every keyword metered (schema_bounds).

    A schema's pattern comes from a third party (an MCP server, a client), the text it would run on
    from the model, and Python's backtracking engine on a pattern such as `^(a+)+$` holds the event
    loop for seconds. The server checks its own patterns; here, names and types. Which names
    `patternProperties` allow is left to the server too."""
    keywords = dict(cls.VALIDATORS)
    check_additional = keywords["additionalProperties"]

    def additional(validator: Validator, value: Any, instance: Any, schema: Mapping[str, Any]) -> Any:
        return None if "patternProperties" in schema else check_additional(validator, value, instance, schema)

    keywords.update({"pattern": _unchecked, "patternProperties": _unchecked, "additionalProperties": additional})
    extended: type[Validator] = validators.extend(cls, metered_keywords(keywords))
    return extended


def _kinds() -> Mapping[type[Validator], _Kind]:
    metaschemas = metaschema_registry()
    return {draft: _Kind.of(draft, metaschemas)
            for draft in (Draft3Validator, Draft4Validator, Draft6Validator, Draft7Validator, Draft201909Validator,
                          Draft202012Validator)}


# Made once for the drafts jsonschema knows: making one (validators.extend) costs about as much as
# checking a small schema, and an MCP server may list hundreds of tools.
_KINDS = _kinds()


def closed_to_other_names(schema: Mapping[str, Any]) -> bool:
    """Whether names outside `properties` are refused: unless the schema allows other properties
    in so many words, a name it does not list is taken for a misnamed argument (a server that
    ignores it would hide the model's mistake)."""
    extra = schema.get("additionalProperties", False)
    return extra is False and "patternProperties" not in schema


def value_problems(validator: Validator, args: Mapping[str, Any], check: NameCheck) -> list[str]:
    """One line per value that does not fit the schema. Missing and unrecognized top-level names
    are left out: `check` reports them, with did-you-mean hints. Spends from the budget of the
    check under way (schema_bounds.metered): past it, OverBudget."""
    problems = []
    try:
        errors = list(validator.iter_errors(dict(args)))
    except OverBudget:
        raise
    except Exception:  # a schema it cannot follow (an unknown type): the names are checked, the server does the rest
        return []
    for error in errors:
        at_top = not error.absolute_path
        if at_top and (error.validator == "required" or (error.validator == "additionalProperties" and check.accepted)):
            continue
        where = ".".join(str(part) for part in error.absolute_path) or "(arguments)"
        problems.append(f"- {where}: {_shortened(error.message)}")
    return sorted(problems)[:MAX_PROBLEMS]


def _shortened(message: str) -> str:
    """jsonschema quotes the value a message is about, whatever its size."""
    return message if len(message) <= _PROBLEM_CHARS else message[:_PROBLEM_CHARS - 3] + "..."


def describe_problems(tool: str, check: NameCheck, problems: list[str], unrecognized: bool) -> str:
    """The diagnostic for a call whose names (missing, or `unrecognized` ones refused) or values do
    not fit: with names alone wrong, the same message a tool without a schema check gives."""
    if not problems:
        headline = ("required arguments are missing." if check.missing
                    else "it does not take arguments under the names sent.")
        return describe_names(tool, check, headline)
    lines = [f"- {name}: missing (required)" for name in check.missing]
    if unrecognized:
        lines += [f"- {name}: not a parameter of this tool" for name in check.unrecognized]
    lines += problems
    noun = "1 argument does" if len(lines) == 1 else f"{len(lines)} arguments do"
    return "\n".join([f"Tool '{tool}': {noun} not fit the declared parameters.", *lines, *name_lines(check),
                      f"Fix every problem listed and call '{tool}' again."])
