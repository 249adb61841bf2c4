"""The example config file, docs/toolspan.example.toml, written from `Settings` itself so that it
cannot fall behind the code: every setting, commented out at its default, with its description and
its environment variable.

Regenerate it with `python -m gateway.cli.config_example docs/toolspan.example.toml` (no argument: the
file goes to stdout); tests/cli/test_config_example.py fails while the checked-in file differs.
"""

from __future__ import annotations

import json
import sys
import textwrap
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, BaseModel, SecretStr
from pydantic.fields import FieldInfo

from gateway.settings.model import Settings

WIDTH = 100
HEADER = """\
# toolspan's settings: every one, commented out at its default, with its environment variable.
# Generated from gateway/settings/model.py; do not edit by hand. Regenerate it with
#   python -m gateway.cli.config_example docs/toolspan.example.toml
#
# Copy it, uncomment what you change, and start the gateway with `toolspan serve --config FILE`
# (TOML; a .json file is read as JSON). Flags win over TOOLSPAN_* variables, which win over this
# file. A list or a table given as a variable is JSON: TOOLSPAN_TOOLS='["mytools:registry"]'.
"""
NO_DESCRIPTION = "(no description)"


def render() -> str:
    """The whole example file: the top-level settings, then one example table per nested model."""
    parts = [HEADER]
    nested: list[tuple[str, type[BaseModel], str, bool]] = []
    for name, field in Settings.model_fields.items():
        model, single = _table_model(field), _single_model(field)
        parts.append(_setting_block(name, field, nested=model is not None, single=single is not None))
        if model is not None:
            nested.append((name, model, _variable(name, field), False))
        if single is not None:
            nested.append((name, single, _variable(name, field), True))
    for name, model, variable, one in nested:
        parts.append(_table_block(name, model, variable, one))
    return "\n".join(parts)


def _setting_block(name: str, field: FieldInfo, *, nested: bool, single: bool = False) -> str:
    variable = _variable(name, field)
    lines = _comment(field.description or NO_DESCRIPTION)
    json_note = " (JSON)" if _is_structured(field.annotation) or single else ""
    lines.append(f"# variable: {variable}{json_note}")
    if nested:
        lines.append(f"# none by default: one [{name}.NAME] table each, see the end of this file")
    elif single:
        lines.append(f"# a [{name}] table, see the end of this file")
    else:
        lines.append(_assignment(name, field))
    return "\n".join(lines) + "\n"


def _table_block(name: str, model: type[BaseModel], variable: str, one: bool = False) -> str:
    doc = " ".join((model.__doc__ or "").split())
    table = name if one else f"{name}.NAME"
    as_variable = (f"As a variable, one JSON object: {variable}='{{...}}'." if one else
                   f"As a variable, all of them in one JSON object: {variable}='{{\"NAME\": {{...}}}}'.")
    lines = ["# " + "-" * (WIDTH - 2), *_comment(f"[{table}]: {doc}"), *_comment(as_variable), f"#[{table}]"]
    for field_name, field in model.model_fields.items():
        if field.exclude:  # a parent's field this table refuses
            continue
        lines.extend(_comment(field.description or NO_DESCRIPTION))
        lines.append(_assignment(field_name, field))
    return "\n".join(lines) + "\n"


def _assignment(name: str, field: FieldInfo) -> str:
    """`#name = value` at the default (uncommented, it changes nothing), or why there is no value."""
    if field.is_required():
        return f"# {name}: required"
    default = field.get_default(call_default_factory=True)
    if default is None:
        return f"# {name}: unset by default"
    return f"#{name} = {_toml(default)}{_size_note(name, default)}"


def _variable(name: str, field: FieldInfo) -> str:
    alias = field.validation_alias
    if isinstance(alias, AliasChoices) and isinstance(alias.choices[0], str):
        return alias.choices[0]
    if isinstance(alias, str):
        return alias
    return f"{Settings.model_config.get('env_prefix', '')}{name}".upper()


def _table_model(field: FieldInfo) -> type[BaseModel] | None:
    """The model of a `dict[str, Model]` setting (gateway keys, MCP servers), else None."""
    if typing.get_origin(field.annotation) is not dict:
        return None
    value = typing.get_args(field.annotation)[1]
    return value if isinstance(value, type) and issubclass(value, BaseModel) else None


def _single_model(field: FieldInfo) -> type[BaseModel] | None:
    """The model of a setting that is one table of its own (default_limits), else None."""
    annotation = field.annotation
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _is_structured(annotation: Any) -> bool:
    """Whether pydantic-settings reads this setting's variable as JSON (lists, tuples, tables)."""
    return any(typing.get_origin(arm) in (list, tuple, dict) for arm in _arms(annotation))


def _arms(annotation: Any) -> Iterator[Any]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arm in typing.get_args(annotation):
            yield from _arms(arm)
    else:
        yield annotation


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        return json.dumps(str(value))  # a JSON string is a TOML basic string
    if isinstance(value, SecretStr):
        return json.dumps(value.get_secret_value())
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML form for the default {value!r}")


def _size_note(name: str, value: object) -> str:
    if not name.endswith("_bytes") or not isinstance(value, int) or value < 1024:
        return ""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value % size == 0:
            return f"  # {value // size} {unit}"
    return ""


def _comment(text: str) -> list[str]:
    return ["# " + line for line in textwrap.wrap(text, WIDTH - 2, break_on_hyphens=False)]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1 or (args and args[0].startswith("-")):
        print("usage: python -m gateway.cli.config_example [FILE]  (no FILE: stdout)", file=sys.stderr)
        return 2
    text = render()
    if args:
        Path(args[0]).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
