"""A call's arguments as the model sent them (JSON text, or an object a client already decoded),
read into the dict a tool takes: parsed, bounded in depth, lone surrogates replaced; or the
rejection, worded for the model, saying why they cannot be. The first stage of every parse step,
and of the check of the client's own tools' calls."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gateway.tools.results import Rejection, valid_json
from gateway.wire.json_depth import nests_deeper

MAX_ARGUMENT_DEPTH = 64  # levels of objects and arrays in a call's arguments; no tool needs more


def read_arguments(tool: str, raw: str | Mapping[str, Any] | None,
                   max_depth: int = MAX_ARGUMENT_DEPTH) -> dict[str, Any] | Rejection:
    """The arguments as a dict, or a rejection saying why they are not a JSON object a tool can
    take. Lone surrogates in their strings (valid JSON escapes, invalid text) become U+FFFD."""
    if raw is None:
        return {}
    if isinstance(raw, Mapping):
        value: Any = dict(raw)
    elif not raw.strip():
        return {}  # some providers send "" for a call without arguments
    else:
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            return Rejection("invalid_json", (
                f"Tool '{tool}': the arguments are not valid JSON ({exc.msg} at character {exc.pos}). "
                "Send them as one JSON object of named parameters."))
        except ValueError:  # valid JSON Python will not read: an integer with thousands of digits
            return Rejection("invalid_json", (
                f"Tool '{tool}': the arguments hold a value too large to read. "
                "Send them as one JSON object of named parameters with shorter values."))
        except RecursionError:
            return _too_deep(tool, max_depth)
    if not isinstance(value, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
            type(value), "a number")
        return Rejection("invalid_json", (
            f"Tool '{tool}': the arguments must be a JSON object of named parameters, not {kind}."))
    if nests_deeper(value, max_depth):
        return _too_deep(tool, max_depth)
    cleaned: dict[str, Any] = valid_json(value)
    return cleaned


def _too_deep(tool: str, max_depth: int) -> Rejection:
    return Rejection("invalid_json", (
        f"Tool '{tool}': the arguments are nested more than {max_depth} levels deep. "
        "Send them as a flatter JSON object of named parameters."))
