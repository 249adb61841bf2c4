"""The JSON schema of a tool's arguments, from whichever one of its three declarations the tool
uses: `parameters` (Param objects), `parameters_schema` (a JSON schema of its own) or
`args_model` (a pydantic model); none declares no arguments. Checked as the tool is built: a
declaration that is wrong fails then, naming the tool."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from gateway.tools.params import Param, ToolDeclarationError, parameters_schema, without_titles


def declared_schema(tool: str, parameters: Sequence[Param] | None, schema: Mapping[str, Any] | None,
                    args_model: type[BaseModel] | None) -> dict[str, Any]:
    """The arguments schema `tool` declares, by the one style it declares it in."""
    given = {"parameters": parameters, "parameters_schema": schema, "args_model": args_model}
    styles = [name for name, declared in given.items() if declared is not None]
    if len(styles) > 1:
        raise ToolDeclarationError(f"tool {tool!r} declares its arguments twice ({' and '.join(styles)}); use one")
    if parameters is not None:
        return _from_parameters(tool, parameters)
    if args_model is not None:
        return _from_model(tool, args_model)
    if schema is not None:
        return _from_schema(tool, schema)
    return {"type": "object", "properties": {}}


def _from_parameters(tool: str, parameters: Sequence[Param]) -> dict[str, Any]:
    if not all(isinstance(param, Param) for param in parameters):
        raise ToolDeclarationError(f"tool {tool!r}: parameters must be Param objects")
    names = [p.name for p in parameters]
    if len(names) != len(set(names)):
        raise ToolDeclarationError(f"tool {tool!r} declares a parameter twice")
    for param in parameters:
        param.check(f"tool {tool!r}")
    return parameters_schema(parameters)


def _from_model(tool: str, args_model: type[BaseModel]) -> dict[str, Any]:
    if not (isinstance(args_model, type) and issubclass(args_model, BaseModel)):
        raise ToolDeclarationError(f"tool {tool!r}: args_model must be a pydantic model class")
    generated: dict[str, Any] = without_titles(args_model.model_json_schema())
    return generated


def _from_schema(tool: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(schema, Mapping) or schema.get("type") != "object":
        raise ToolDeclarationError(
            f"tool {tool!r}: parameters_schema must be a JSON schema with \"type\": \"object\"")
    if not isinstance(schema.get("properties", {}), Mapping):
        raise ToolDeclarationError(f"tool {tool!r}: parameters_schema properties must be an object")
    try:
        copied: dict[str, Any] = json.loads(json.dumps(schema))  # a private, JSON-clean copy
    except (TypeError, ValueError) as exc:
        raise ToolDeclarationError(f"tool {tool!r}: parameters_schema is not plain JSON ({exc})") from exc
    return copied
