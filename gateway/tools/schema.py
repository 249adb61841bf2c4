"""The parse step's check of argument values against a tool's own JSON schema (MCP tools ask for
it): every problem in one message, in the words of the other argument diagnostics."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jsonschema import (
    Draft4Validator,
    Draft6Validator,
    Draft7Validator,
    Draft201909Validator,
    Draft202012Validator,
    validators,
)
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator

from gateway.tools.params import NameCheck, ToolDeclarationError, describe_names, name_lines

MAX_PROBLEMS = 20  # a model can send thousands of bad values; the message names the first few
_PROBLEM_CHARS = 200


def schema_validator(tool: str, schema: Mapping[str, Any]) -> Validator:
    """A validator for `schema` (by its `$schema`, draft 2020-12 when it names none); a schema that
    is not valid JSON Schema fails here, when the tool is built."""
    cls = validators.validator_for(schema, default=Draft202012Validator)
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        raise ToolDeclarationError(f"tool {tool!r}: its parameters schema is not valid JSON Schema "
                                   f"({exc.message})") from exc
    validator: Validator = (_PATTERN_FREE.get(cls) or _without_patterns(cls))(schema)
    return validator


def _unchecked(validator: Validator, value: Any, instance: Any, schema: Mapping[str, Any]) -> None:
    return None


def _without_patterns(cls: type[Validator]) -> type[Validator]:
    """`cls` checking no regular expression: a schema's pattern comes from a third party (an MCP
    server), the text it would run on from the model, and Python's backtracking engine on a
    pattern such as `^(a+)+$` holds the event loop for seconds. The server checks its own patterns;
    here, names and types. Which names `patternProperties` allow is left to the server too."""
    check_additional = cls.VALIDATORS["additionalProperties"]

    def additional(validator: Validator, value: Any, instance: Any, schema: Mapping[str, Any]) -> Any:
        return None if "patternProperties" in schema else check_additional(validator, value, instance, schema)

    extended: type[Validator] = validators.extend(cls, {"pattern": _unchecked, "patternProperties": _unchecked,
                                                        "additionalProperties": additional})
    return extended


# Made once for the drafts jsonschema knows: making one (validators.extend) costs about as much as
# checking a small schema, and an MCP server may list hundreds of tools.
_PATTERN_FREE: Mapping[type[Validator], type[Validator]] = {
    cls: _without_patterns(cls)
    for cls in (Draft4Validator, Draft6Validator, Draft7Validator, Draft201909Validator, Draft202012Validator)}


def closed_to_other_names(schema: Mapping[str, Any]) -> bool:
    """Whether names outside `properties` are refused: unless the schema allows other properties
    in so many words, a name it does not list is taken for a misnamed argument (a server that
    ignores it would hide the model's mistake)."""
    extra = schema.get("additionalProperties", False)
    return extra is False and "patternProperties" not in schema


def value_problems(validator: Validator, args: Mapping[str, Any], check: NameCheck) -> list[str]:
    """One line per value that does not fit the schema. Missing and unrecognized top-level names
    are left out: `check` reports them, with did-you-mean hints."""
    problems = []
    try:
        errors = list(validator.iter_errors(dict(args)))
    except Exception:  # a schema it cannot follow (a $ref to nowhere): the names are checked, the server does the rest
        return []
    for error in errors:
        at_top = not error.absolute_path
        if at_top and (error.validator == "required" or (error.validator == "additionalProperties" and check.accepted)):
            continue
        where = ".".join(str(part) for part in error.absolute_path) or "(arguments)"
        text = error.message if len(error.message) <= _PROBLEM_CHARS else error.message[:_PROBLEM_CHARS - 3] + "..."
        problems.append(f"- {where}: {text}")
    return sorted(problems)[:MAX_PROBLEMS]


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
