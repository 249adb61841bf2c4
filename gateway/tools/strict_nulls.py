"""A strict model's nulls, read in the parse step of a strict tool. Strict mode makes a model
send every property, null for an optional one it means to leave out (gateway.tools.strict makes
the optional ones nullable), so a null is read as "not sent" wherever the declaration made the
property optional and does not itself take null; a required one sent as null is missing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.tools.strict import accepts_null


def drop_optional_nulls(args: dict[str, Any], declared: Mapping[str, Any]) -> dict[str, Any]:
    """`args` without the nulls that stand for "not sent". Strict mode makes a model send every
    property, null for an optional one it means to leave out; so a null is dropped where the
    declaration made the property optional and does not take null as a value. Nested objects and
    arrays of objects too, wherever the declaration says which schema a value has."""
    reader = _NullReader(declared)
    try:
        return reader.object(args, reader.resolve(declared))
    except RecursionError:  # arguments nested as deep as Python recurses: leave them to the parse step
        return args


def required_nulls(args: Mapping[str, Any], declared: Mapping[str, Any]) -> list[str]:
    """The required top-level names sent as null where the declaration does not take null."""
    reader = _NullReader(declared)
    root = reader.resolve(declared)
    properties = root.get("properties") or {}
    return [name for name in root.get("required") or () if name in args and args[name] is None
            and isinstance(properties.get(name), Mapping) and not accepts_null(properties[name], reader.target)]


class _NullReader:
    def __init__(self, declared: Mapping[str, Any]) -> None:
        self.declared = declared
        defs = declared.get("$defs")
        self.defs: Mapping[str, Any] = defs if isinstance(defs, Mapping) else {}

    def target(self, ref: str) -> Mapping[str, Any] | None:
        found = self.declared if ref == "#" else self.defs.get(ref.removeprefix("#/$defs/"))
        return found if isinstance(found, Mapping) else None

    def resolve(self, schema: Mapping[str, Any]) -> Mapping[str, Any]:
        for _ in range(64):  # a definition may itself be a $ref; a cycle of them ends here
            ref = schema.get("$ref")
            found = self.target(ref) if isinstance(ref, str) else None
            if found is None:
                return schema
            schema = found
        return schema

    def object(self, value: dict[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
        properties = schema.get("properties")
        if not isinstance(properties, Mapping):
            return value
        required = schema.get("required") or ()
        out: dict[str, Any] = {}
        for key, item in value.items():
            sub = properties.get(key)
            if not isinstance(sub, Mapping):
                out[key] = item
            elif item is not None:
                out[key] = self.value(item, sub)
            elif key in required or accepts_null(sub, self.target):
                out[key] = None
        return out

    def value(self, value: Any, schema: Mapping[str, Any]) -> Any:
        shape = self.shape(value, schema)
        if shape is None:
            return value
        if isinstance(value, dict):
            return self.object(value, shape)
        return [self.value(item, shape["items"]) for item in value]

    def shape(self, value: Any, schema: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The schema that says how `value` (an object or array) nests: `schema` itself or its
        one option of that kind; None when there is none, or more than one to choose from."""
        key = "properties" if isinstance(value, dict) else "items" if isinstance(value, list) else None
        if key is None:
            return None
        schema = self.resolve(schema)
        options = [*(schema.get("anyOf") or ()), *(schema.get("oneOf") or ()), *(schema.get("allOf") or ())[:1]]
        candidates = [schema, *(self.resolve(o) for o in options if isinstance(o, Mapping))]
        fitting = [c for c in candidates if isinstance(c.get(key), Mapping)]
        if len(fitting) > 1 and isinstance(value, dict):  # a tagged union: the tag picks the option
            fitting = [c for c in fitting if self.tags_match(value, c["properties"])]
        return fitting[0] if len(fitting) == 1 else None

    def tags_match(self, value: dict[str, Any], properties: Mapping[str, Any]) -> bool:
        """Whether `value` carries every constant its properties fix (pydantic's Literal tags)."""
        fixed = {name: self.resolve(sub)["const"] for name, sub in properties.items()
                 if isinstance(sub, Mapping) and "const" in self.resolve(sub)}
        return all(value.get(name) == constant for name, constant in fixed.items())
