"""Settings in words: the one-line errors an operator reads, and the help of `toolspan serve`.

A refused setting is said where it came from (the `--flag`, the environment variable or the config
file's key), with what was given and what is accepted, one line each; a config key that names no
setting gets the closest names (difflib). None of pydantic's own text (its titles, source class
names or links) reaches the operator.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, Literal, Union

from annotated_types import Ge, Gt, Le, Lt, MinLen
from pydantic import AliasChoices, BaseModel, SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from gateway.wire.escaping import without_credentials

ENV_PREFIX = "TOOLSPAN_"
# Values never repeated in an error: keys, secrets, and the headers and environment of MCP servers.
_HIDDEN_PARTS = ("key", "secret", "token", "password", "headers", "env")
_PREFIX_OF_VALUE_ERROR = re.compile(r"^(Value error|Assertion failed), ")
_UNPARSED = re.compile(r'error parsing value for field "(\w+)"')


class SettingsInvalid(ValueError):
    """Settings refused at start-up: one line per problem (str() joins them with newlines), with
    the credentials of any URL repeated in them masked (a proxy's or a Redis URL's password)."""

    def __init__(self, lines: Sequence[str]) -> None:
        masked = [without_credentials(line) for line in lines]
        super().__init__("\n".join(masked))
        self.lines = masked


class Refused(ValueError):
    """A check over several settings (a model's validator) refusing one of them: `at` is the path
    to it from the model that checks, `why` says what is wrong. Its line names that setting, and
    shows what was given there, as a refusal of the setting itself does."""

    def __init__(self, at: Sequence[str], why: str) -> None:
        super().__init__(f"{'.'.join(at)}: {why}")
        self.at = tuple(at)
        self.why = why


def version() -> str:
    """The installed toolspan's version (its distribution's metadata)."""
    try:
        return metadata.version("toolspan")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def env_names(model: type[BaseModel], name: str) -> list[str]:
    """The environment variables a setting is read from: TOOLSPAN_<NAME>, or its aliases (OTEL_*)."""
    alias = model.model_fields[name].validation_alias
    if isinstance(alias, AliasChoices):
        return [choice for choice in alias.choices if isinstance(choice, str) and choice.isupper()]
    return [f"{ENV_PREFIX}{name.upper()}"]


def _default(field: FieldInfo) -> str:
    value = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
    if value is None or value is PydanticUndefined:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple | dict) and not value:
        return "none"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def option_help(model: type[BaseModel], name: str, text: str | None = None, default: str | None = None) -> str:
    """The --help text of the option for setting `name`: what it is, its default (`default` when
    the field's own does not say what happens), its variable."""
    field = model.model_fields[name]
    said = (text or field.description or name).rstrip(".")
    shown = default if default is not None else _default(field)
    return f"{said} (default: {shown}; env {env_names(model, name)[0]})".replace("%", "%%")


# --- what a setting accepts -------------------------------------------------------------------------

def _bounds(metadata_items: Sequence[Any]) -> str:
    low = next((f"{m.ge:g}" for m in metadata_items if isinstance(m, Ge)), None)
    above = next((f"{m.gt:g}" for m in metadata_items if isinstance(m, Gt)), None)
    high = next((f"{m.le:g}" for m in metadata_items if isinstance(m, Le)), None)
    below = next((f"{m.lt:g}" for m in metadata_items if isinstance(m, Lt)), None)
    shortest = next((m.min_length for m in metadata_items if isinstance(m, MinLen)), None)
    if shortest is not None:
        return f" of at least {shortest} characters"
    if low is not None and high is not None:
        return f" from {low} to {high}"
    parts = [f"{low} or more" if low is not None else f"above {above}" if above is not None else "",
             f"at most {high}" if high is not None else f"below {below}" if below is not None else ""]
    return (" " + ", ".join(p for p in parts if p)) if any(parts) else ""


def _kind(annotation: Any) -> str:
    """What a type accepts, in words."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        kinds = [_kind(arg) for arg in typing.get_args(annotation) if arg is not type(None)]
        return " or ".join(kinds) + (" (or empty: unset)" if type(None) in typing.get_args(annotation) else "")
    if origin is Literal:
        return "one of " + ", ".join(str(value) for value in typing.get_args(annotation))
    if origin in (list, tuple, set):
        return 'a list (in a variable, JSON such as ["a", "b"])'
    if origin is dict or (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        return "a table of values (in a variable, a JSON object)"
    named = {bool: "true or false", int: "an integer", float: "a number", str: "text", Path: "a file path",
             SecretStr: "text"}
    return named.get(annotation, getattr(annotation, "__name__", str(annotation)))


def accepted(field: FieldInfo) -> str:
    return _kind(field.annotation) + _bounds(field.metadata)


# --- errors -----------------------------------------------------------------------------------------

def _hidden(loc: Sequence[Any]) -> bool:
    return any(part in str(name).lower() for name in loc for part in _HIDDEN_PARTS)


def _without_secrets(value: Any) -> Any:
    """`value` with what it holds under a hidden name (an MCP server's headers, a key's secret)
    replaced, at any depth: a refused table is repeated whole."""
    if isinstance(value, Mapping):
        return {name: "(hidden)" if _hidden((name,)) else _without_secrets(item) for name, item in value.items()}
    if isinstance(value, list | tuple):
        return [_without_secrets(item) for item in value]
    return value


def _shown(value: Any, loc: Sequence[Any]) -> str:
    if _hidden(loc):
        return "(hidden)"
    text = repr(_without_secrets(value))
    return text if len(text) <= 80 else text[:77] + "..."


def _field_model(model: type[BaseModel], loc: Sequence[Any]) -> tuple[type[BaseModel], FieldInfo | None, Any]:
    """The model whose field `loc` ends at, that field (None when `loc` ends in a list's item or a
    table's value, or names no field), and the type of what `loc` names (None when it names no field)."""
    annotation: Any = model
    field: FieldInfo | None = None
    for part in loc:
        while typing.get_origin(annotation) in (Union, types.UnionType):
            annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model, field = annotation, annotation.model_fields.get(str(part))
            if field is None:
                return model, None, None
            annotation = field.annotation
        elif typing.get_origin(annotation) in (dict, list, tuple):
            annotation = typing.get_args(annotation)[-1]  # a key or an index: on to the values
            field = None
    if field is None and isinstance(annotation, type) and issubclass(annotation, BaseModel):
        model = annotation  # `loc` ends at a value that is itself a model (an MCP server's table)
    return model, field, annotation


def _inside(given: Any, path: Sequence[str]) -> Any:
    """What was given at `path` within a table (None when it holds nothing there)."""
    for name in path:
        given = given.get(name) if isinstance(given, Mapping) else None
    return given


class Sources:
    """Where each setting's value came from: `flags` given, the environment, or the config file."""

    def __init__(self, model: type[BaseModel], flags: Mapping[str, Any], environ: Mapping[str, str],
                 config: Path | None) -> None:
        self.model = model
        self.flags = flags
        self.environ = {name.upper(): value for name, value in environ.items()}
        self.config = config

    def where(self, loc: Sequence[Any]) -> str:
        """`--port`, `TOOLSPAN_PORT` or `config file gw.toml, key port` (nested: the path after)."""
        top, rest = str(loc[0]), ".".join(map(str, loc[1:]))
        inner = f" (at {rest})" if rest else ""
        if top in self.flags:
            return f"--{top.replace('_', '-')}{inner}"
        names = env_names(self.model, top) if top in self.model.model_fields else []
        found = next((name for name in names if name in self.environ), None)
        if found is not None:
            return f"{found}{inner}"
        return f"{self.place()}, key {'.'.join(map(str, loc))}"

    def place(self) -> str:
        return f"config file {self.config}" if self.config is not None else "settings"

    def line(self, error: Mapping[str, Any]) -> str:
        loc, given = tuple(error["loc"]), error.get("input")
        message = _PREFIX_OF_VALUE_ERROR.sub("", str(error["msg"]))
        refused = (error.get("ctx") or {}).get("error")
        if isinstance(refused, Refused):  # said of the setting it names, not of the table checked
            loc, given, message = (*loc, *refused.at), _inside(given, refused.at), refused.why
        if not loc:  # a check over the settings as a whole
            return f"{self.place()}: {message}"
        if error["type"] == "extra_forbidden":
            return self._unknown(loc)
        _, field, annotation = _field_model(self.model, loc)
        expected = accepted(field) if field is not None else None if annotation is None else _kind(annotation)
        if error["type"] == "missing" and expected is not None:
            return f"{self.where(loc)}: required, and not given (expected {expected})"
        if error["type"] not in ("value_error", "assertion_error") and expected is not None:
            message = f"expected {expected}"
        if isinstance(given, Mapping):  # a table: its key names it, and its values would be noise
            return f"{self.where(loc)}: not accepted: {message}"
        return f"{self.where(loc)}: {_shown(given, loc)} is not accepted: {message}"

    def _unknown(self, loc: Sequence[Any]) -> str:
        model = _field_model(self.model, loc[:-1])[0] if len(loc) > 1 else self.model
        name = str(loc[-1])
        close = difflib.get_close_matches(name.lower(), list(model.model_fields), n=2, cutoff=0.6)
        hint = (f"did you mean {' or '.join(repr(c) for c in close)}?" if close
                else "no setting has that name (toolspan serve --help lists the common ones)")
        inside = f" in {'.'.join(map(str, loc[:-1]))}" if len(loc) > 1 else ""
        return f"{self.place()}: unknown key {name!r}{inside}: {hint}"


def explain(error: ValidationError | ValueError, model: type[BaseModel], flags: Mapping[str, Any],
            environ: Mapping[str, str], config: Path | None) -> SettingsInvalid:
    """The operator's lines for a refusal by pydantic (a ValidationError, or pydantic-settings'
    error for a variable whose JSON does not parse)."""
    sources = Sources(model, flags, environ, config)
    if isinstance(error, ValidationError):
        return SettingsInvalid([sources.line(e) for e in error.errors(include_url=False)])
    unparsed = _UNPARSED.search(str(error))
    if unparsed is None:
        return SettingsInvalid([f"settings: {error}"])
    name = unparsed.group(1)
    where = sources.where((name,))
    given = sources.environ.get(where, "")
    cause = f" ({error.__cause__})" if error.__cause__ is not None else ""
    return SettingsInvalid([f"{where}: {_shown(given, (name,))} is not accepted: expected JSON, "
                            f"{accepted(model.model_fields[name])}{cause}"])
